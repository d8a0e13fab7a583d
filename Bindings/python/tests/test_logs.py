"""The library's log lines routed to Python (Runtime(log=..., log_level=...)) and the reason a
call failed (sf_last_error_message, as SessionFlowError.detail and last_error_message())."""
import threading

import pytest

import sessionflow as sf

ACCESS = "SENTINEL-PY-LOG-ACCESS-7e21"
REFRESH = "SENTINEL-PY-LOG-REFRESH-90b3"


def test_log_lines_reach_the_hosts_function_at_its_level_and_never_after_destroy():
    lines = []
    lock = threading.Lock()
    destroyed = threading.Event()
    late = []

    def log(level, line):
        assert isinstance(level, sf.LogLevel)
        with lock:
            lines.append((level, line))
            if destroyed.is_set():
                late.append(line)

    rt = sf.Runtime(log=log, log_level=sf.LogLevel.TRACE)
    rt.sign_in(ACCESS, REFRESH, 3600, "member-py")
    rt.logout()
    rt.subscribe_state(lambda state: None)  # never closed: destroy warns about it
    assert rt.destroy() == 1
    destroyed.set()
    with lock:
        assert lines, "no log line reached the host"
        assert any(level <= sf.LogLevel.DEBUG for level, _ in lines)
        assert any(level == sf.LogLevel.WARNING and "never closed" in line for level, line in lines)
        assert not any(ACCESS in line or REFRESH in line for _, line in lines)
        assert late == []


def test_lines_below_the_level_are_not_handed_over():
    levels = []
    with sf.Runtime(log=lambda level, line: levels.append(level), log_level=sf.LogLevel.WARNING) as rt:
        rt.sign_in(ACCESS, REFRESH, 3600, "member-py")
        rt.logout()
    assert all(level >= sf.LogLevel.WARNING for level in levels)


def test_a_refused_option_is_named_in_the_error_and_in_the_log():
    lines = []
    with pytest.raises(sf.InvalidArgumentError) as error:
        sf.Runtime(token_endpoint="http://auth.example.com/token", client_id="c",
                   log=lambda level, line: lines.append((level, line)))
    assert error.value.detail is not None
    assert error.value.detail.startswith("sf_options.token_endpoint uses plain http")
    assert sf.last_error_message().startswith("sf_runtime_create: sf_options.token_endpoint ")
    assert any(level == sf.LogLevel.ERROR and "sf_options.token_endpoint" in line for level, line in lines)
    with pytest.raises(sf.InvalidArgumentError) as error:
        sf.Runtime(log_level=9)
    assert "sf_options.log_level is 9" in (error.value.detail or "")


def test_an_exception_in_the_log_function_follows_the_callback_error_policy():
    def log(level, line):
        raise RuntimeError("the host's logger broke")

    rt = sf.Runtime(log=log, log_level=sf.LogLevel.TRACE)
    with pytest.raises(sf.CallbackError) as error:
        rt.sign_in(ACCESS, REFRESH, 3600, "member-py")
        rt.logout()
        rt.destroy()
    assert isinstance(error.value.exception, RuntimeError)
    if not rt._destroyed:
        try:
            rt.destroy()
        except sf.CallbackError:
            pass
