/* Runs every test of the C suite; prints "N passed, M failed". */
#include "harness.h"

#define SF_TEST_LIST(XX)                                             \
    XX(errors_every_code_has_a_name_and_a_text)                      \
    XX(host_input_tokens_over_their_limit_are_refused_naming_the_field) \
    XX(host_input_member_ids_and_account_keys_must_be_utf8)          \
    XX(host_input_a_wrong_tokens_size_names_the_expected_size)       \
    XX(host_input_control_characters_reach_the_log_escaped)          \
    XX(host_input_control_characters_reach_standard_error_escaped)   \
    XX(host_input_an_issuer_over_its_limit_is_refused)               \
    XX(errors_unknown_codes_have_static_fallbacks)                   \
    XX(version_macros_match_the_library)                             \
    XX(runtime_create_and_destroy)                                   \
    XX(runtime_bad_input_never_crashes)                              \
    XX(runtime_destroy_twice_is_eclosed)                             \
    XX(runtime_destroy_from_its_loop_thread_is_ebusy)                \
    XX(runtime_calls_after_destroy_are_eclosed)                      \
    XX(runtime_options_are_validated)                                \
    XX(runtime_oauth_endpoints_must_be_https_or_loopback)            \
    XX(subscribe_state_gets_the_current_state_first)                 \
    XX(subscribe_bad_input_takes_no_ownership)                       \
    XX(subscription_close_twice_and_unknown_handles)                 \
    XX(release_runs_once_after_the_last_callback)                    \
    XX(close_from_inside_its_own_callback)                           \
    XX(close_from_another_thread_waits_for_the_running_callback)     \
    XX(destroy_completes_and_releases_open_subscriptions)            \
    XX(events_carry_kind_member_and_reason)                          \
    XX(events_start_up_event_waits_for_sf_runtime_start)             \
    XX(session_sign_in_logout_and_local_checks)                      \
    XX(session_illegal_transitions_are_estate)                       \
    XX(session_member_id_buffer_too_small_is_erange)                 \
    XX(session_fresh_token_runs_its_callback_on_the_loop_thread)     \
    XX(session_fresh_token_when_logged_out)                          \
    XX(refresher_single_flight_and_rotation)                         \
    XX(refresher_completed_twice_is_eclosed)                         \
    XX(refresher_terminal_failure_expires_the_session)               \
    XX(refresher_transient_failure_keeps_the_session)                \
    XX(refresher_unauthorized_refreshes_only_the_current_token)      \
    XX(refresher_missing_is_a_configuration_error)                   \
    XX(refresher_absurd_retry_after_is_capped)                       \
    XX(refresher_cancel_waits_for_the_request_to_end)                \
    XX(refresher_tokens_after_cancel_are_kept)                       \
    XX(refresher_never_ended_cancel_is_given_up)                     \
    XX(borrowed_loop_runs_beside_the_hosts_own_timer)                \
    XX(borrowed_loop_calls_off_its_thread_are_ethread)               \
    XX(refresh_release_borrowed_runs_once_after_the_last_refresh)    \
    XX(refresh_release_borrowed_destroy_right_after_asking_for_a_refresh) \
    XX(refresh_release_owned_runs_once_before_destroy_returns)       \
    XX(refresh_release_failed_create_takes_no_ownership)             \
    XX(refresh_release_runs_without_a_refresher_and_honours_size)    \
    XX(threads_close_subscriptions_while_the_loop_delivers)          \
    XX(limits_token_requests_beyond_the_limit_are_ebusy)             \
    XX(limits_destroy_with_a_full_queue_answers_everyone_and_returns) \
    XX(limits_no_waiter_gets_a_token_after_a_logout)                 \
    XX(memory_no_token_or_key_is_left_after_logout_and_destroy)      \
    XX(abi_struct_sizes_of_released_layouts_only)                    \
    XX(abi_an_observer_without_any_callback_is_refused)              \
    XX(abi_handles_of_one_kind_are_never_taken_for_another)          \
    XX(abi_a_late_refresh_answer_after_logout_is_eclosed)            \
    XX(secrets_never_reach_a_host_or_the_logs)                       \
    XX(logs_go_to_the_hosts_function_only_never_with_a_token)        \
    XX(logs_below_the_hosts_level_are_not_handed_over)               \
    XX(logs_a_refused_option_is_named_to_the_host_and_in_the_last_error) \
    XX(logs_destroy_from_inside_the_log_function_is_ebusy)           \
    XX(last_error_message_names_the_call_and_is_the_threads_own)     \
    XX(accounts_listed_switched_and_signed_out_one_by_one)          \
    XX(accounts_restart_restores_the_active_one_and_lists_the_others) \
    XX(accounts_bad_input_is_einval_and_changes_nothing)             \
    XX(store_status_tells_an_unreadable_store_from_no_session)       \
    XX(store_status_sign_in_replacing_store_is_the_hosts_choice)     \
    XX(store_key_options_are_validated)                              \
    XX(store_key_from_the_host_opens_the_store_and_no_other_key_does) \
    XX(sign_in_bad_input_calls_nothing)                              \
    XX(sign_in_device_approved_through_discovery)                    \
    XX(profile_kept_from_the_issuer_narrowed_by_a_refresh_and_sealed) \
    XX(profile_none_for_bare_tokens_and_bad_handles)                 \
    XX(sign_in_device_with_the_runtimes_endpoints)                   \
    XX(sign_in_with_the_runtimes_issuer_then_refresh)                \
    XX(sign_in_device_denied_is_edenied)                             \
    XX(sign_in_device_expired_is_eexpired)                           \
    XX(sign_in_device_cancelled_mid_poll_sends_nothing_more)         \
    XX(sign_in_cancel_inside_on_prompt_and_before_the_start)         \
    XX(sign_in_discovery_refused_is_econfig_naming_the_member)       \
    XX(sign_in_destroy_with_a_sign_in_running)                       \
    XX(sign_in_on_a_borrowed_loop_and_its_teardown)                  \
    XX(sign_in_browser_approved_through_discovery)                   \
    XX(sign_in_browser_without_start_page)                           \
    XX(sign_in_browser_denied_is_edenied)                            \
    XX(sign_in_browser_timeout_is_eexpired)                          \
    XX(sign_in_browser_cancelled_closes_the_listener)                \
    XX(sign_in_browser_bad_input_and_destroy)                        \
    XX(authorize_bad_input_calls_nothing)                            \
    XX(authorize_when_logged_out_is_enotloggedin_in_the_callback)    \
    XX(authorize_gives_the_header_the_resource_accepts)              \
    XX(authorize_a_revoked_token_under_50_concurrent_requests_refreshes_once) \
    XX(authorize_a_dead_session_is_eauth_once_per_request)           \
    XX(authorize_curl_client_retries_a_revoked_token_once)           \
    XX(authorize_curl_client_on_a_dead_session_fails_each_request_once) \
    XX(token_info_a_narrower_scope_is_reported_as_granted)          \
    XX(token_info_the_scope_asked_for_when_granted_whole)           \
    XX(token_info_bad_arguments_are_einval)                          \
    XX(dpop_options_and_a_bad_key_are_einval)                        \
    XX(dpop_host_key_refreshes_with_proofs_and_authorizes_as_dpop)   \
    XX(dpop_a_nonce_on_a_good_answer_serves_the_next_proof)          \
    XX(load_relocation_tables_are_released_after_load)

#define SF_DECLARE_(name) void test_##name(void);
SF_TEST_LIST(SF_DECLARE_)
#undef SF_DECLARE_

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    static const sf_test_case tests[] = {
#define SF_ENTRY_(name) {#name, test_##name},
        SF_TEST_LIST(SF_ENTRY_)
#undef SF_ENTRY_
    };
    recorder_note_main_thread();
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (only && !strstr(tests[i].name, only)) continue;
        sf_test_failures = 0;
        tests[i].fn();
        if (sf_test_failures == 0) {
            passed++;
            printf("ok   %s\n", tests[i].name);
        } else {
            failed++;
            printf("FAIL %s\n", tests[i].name);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    if (only && passed + failed == 0) {
        fprintf(stderr, "no test matches \"%s\"\n", only);
        return 1;
    }
    return failed == 0 ? 0 : 1;
}
