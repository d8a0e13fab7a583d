#!/usr/bin/env bash
# Checks oauth_server.py's fault modes with the curl command line (no Swift, no client of ours):
# redirect:<code>, rotate-late:<s> (overlap = reuse, cancel = rollback, delivered then replayed =
# reuse, --strict-reuse), stream-huge[-chunked]:<MiB>, gzip-bomb, echo, echo-200, and the hooks
# /__last_request, /__requests, /__redirect_hits, the metadata documents (RFC 8414, OpenID Connect)
# with set:/set-json:/drop:/status:/redirect: faults on them, the device grant (RFC 8628) with its
# /__device/* hooks, and the authorization code grant with PKCE (consent form, loopback redirect,
# S256 verifier). About 20 s (inflating the gzip bomb is most).
# Usage: bash Tests/Fixtures/verify_oauth_server.sh       (needs python3 with authlib and flask, curl, gzip)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT

passed=0
failed=0
check() {  # check NAME EXPECTED ACTUAL
    if [ "$2" == "$3" ]; then
        passed=$((passed + 1))
        echo "ok   $1"
    else
        failed=$((failed + 1))
        echo "FAIL $1: expected [$2], got [$3]"
    fi
}

# start NAME [server flags]: sets B to the base URL of a new server (ended with this script).
start() {
    local name=$1
    shift
    mkfifo "$work/$name.in"
    python3 "$here/oauth_server.py" "$@" <"$work/$name.in" >"$work/$name.out" 2>"$work/$name.err" &
    pids+=($!)
    exec {lifeline}>"$work/$name.in"  # its stdin stays open until this script ends
    for _ in $(seq 100); do grep -q PORT "$work/$name.out" 2>/dev/null && break; sleep 0.1; done
    B="http://127.0.0.1:$(awk '{print $2}' "$work/$name.out")"
}

json() {  # json EXPRESSION: evaluates a Python expression over the JSON on stdin, `d`
    python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"
}
stat() { curl -s "$B/__stats" | json "d['$1']"; }
fault() { curl -s "$B/__fault" "$@" >/dev/null; }
signin() { curl -s "$B/oauth/token" -d grant_type=password -d username=alice -d 'password=correct horse' -d client_id=sessionflow-public; }
refresh() { curl -s "$B/oauth/token" -d grant_type=refresh_token -d "refresh_token=$1" -d client_id=sessionflow-public "${@:2}"; }
me() { curl -s -o /dev/null -w "%{http_code}" "$B/api/me" -H "Authorization: Bearer $1"; }

start main
echo "server $B"

echo "== redirect:<code>"
tokens=$(signin)
rt=$(echo "$tokens" | json "d['refresh_token']")
target=$(curl -s "$B/__redirect_hits" | json "d['port']")
for code in 301 302 303 307 308; do
    fault -d "mode=redirect:$code"
    got=$(refresh "$rt" -o /dev/null -w "%{http_code} %{redirect_url}")
    check "redirect:$code answers $code to the target" "$code http://127.0.0.1:$target/oauth/token" "$got"
done
check "nothing reached the target unfollowed" "0" "$(stat redirect_target_hits)"
fault -d mode=redirect:307
check "307 followed (curl -L) gets the target's token" "tok-from-redirect-target" \
    "$(refresh "$rt" -L | json "d['access_token']")"
check "the target recorded the hit, refresh token included" "POST /oauth/token True" \
    "$(curl -s "$B/__redirect_hits" | json "d['hits'][-1]['method'], d['hits'][-1]['path'], '$rt' in d['hits'][-1]['body']" | tr -d "(),'")"
fault -d mode=redirect:308 -d endpoint=revoke
check "endpoint=revoke: 308" "308" "$(curl -s -o /dev/null -w '%{http_code}' "$B/oauth/revoke" -d "token=$rt" -d client_id=sessionflow-public)"
fault -d mode=redirect:302 -d endpoint=introspect
check "endpoint=introspect: 302" "302" "$(curl -s -o /dev/null -w '%{http_code}' "$B/oauth/introspect" -d "token=$rt" -d client_id=sessionflow-public)"
check "redirects_sent" "8" "$(stat redirects_sent)"
check "the refresh token survived the redirects" "True" "$(refresh "$rt" | json "'access_token' in d")"
check "an unknown endpoint is refused" "400" "$(curl -s -o /dev/null -w '%{http_code}' "$B/__fault" -d mode=echo -d endpoint=nope)"

echo "== rotate-late:<s>: two overlapping requests with one refresh token"
tokens=$(signin)
rt=$(echo "$tokens" | json "d['refresh_token']")
at=$(echo "$tokens" | json "d['access_token']")
fault -d mode=rotate-late:2
refresh "$rt" >"$work/first" &
first=$!
sleep 0.5
check "the second request: invalid_grant" "invalid_grant" "$(refresh "$rt" | json "d['error']")"
check "reuse_detected" "1" "$(stat reuse_detected)"
wait $first
check "the first still gets its (dead) tokens" "True" "$(json "'refresh_token' in d" <"$work/first")"
check "its refresh token is dead" "invalid_grant" "$(refresh "$(json "d['refresh_token']" <"$work/first")" | json "d['error']")"
check "its access token is dead" "401" "$(me "$(json "d['access_token']" <"$work/first")")"
check "the grant's first access token is dead" "401" "$(me "$at")"
check "families_revoked" "1" "$(stat families_revoked)"

echo "== rotate-late:<s>: the client cancels before the answer"
tokens=$(signin)
rt=$(echo "$tokens" | json "d['refresh_token']")
fault -d mode=rotate-late:3
refresh "$rt" --max-time 0.5 -o /dev/null
check "curl gave up (exit 28)" "28" "$?"
got=$(refresh "$rt")  # at once: the server looks at the holder's socket first
check "the same refresh token works right after" "True" "$(echo "$got" | json "'access_token' in d")"
check "cancelled_before_answer" "1" "$(stat cancelled_before_answer)"
check "no reuse" "1" "$(stat reuse_detected)"
fault -d mode=rotate-late:3
refresh "$(echo "$got" | json "d['refresh_token']")" --max-time 0.3 -o /dev/null
sleep 0.2
check "noticed during the hold, without a second request" "2" "$(stat cancelled_before_answer)"

echo "== rotate-late:<s>: delivered, then the old token again"
tokens=$(signin)
rt=$(echo "$tokens" | json "d['refresh_token']")
fault -d mode=rotate-late:0.5
got=$(refresh "$rt")
newat=$(echo "$got" | json "d['access_token']")
check "delivered after the hold" "200" "$(me "$newat")"
check "rotations_committed (the overlap's dead answer and this one)" "2" "$(stat rotations_committed)"
check "the rotated token again: invalid_grant" "invalid_grant" "$(refresh "$rt" | json "d['error']")"
check "... and the grant is revoked" "401" "$(me "$newat")"
check "reuse_detected" "2" "$(stat reuse_detected)"

echo "== ordinary rotation keeps Authlib's meaning (no --strict-reuse)"
tokens=$(signin)
rt=$(echo "$tokens" | json "d['refresh_token']")
got=$(refresh "$rt")
check "the old token again: invalid_grant" "invalid_grant" "$(refresh "$rt" | json "d['error']")"
check "the new one still works" "True" "$(refresh "$(echo "$got" | json "d['refresh_token']")" | json "'access_token' in d")"
check "no reuse counted" "2" "$(stat reuse_detected)"

echo "== stream-huge:<MiB> and stream-huge-chunked:<MiB>"
fault -d mode=stream-huge:4
got=$(curl -s -D "$work/headers" -o "$work/body" -w "%{size_download}" "$B/oauth/token" -d x=1)
check "stream-huge:4 read whole" "4194304" "$got"
check "with Content-Length" "4194304" "$(tr -d '\r' <"$work/headers" | awk -F': ' 'tolower($1)=="content-length" {print $2}')"
check "a token JSON" "tok-stream" "$(json "d['access_token']" <"$work/body")"
check "streams_completed, stream_bytes_sent" "1 4194304" "$(stat streams_completed) $(stat stream_bytes_sent)"
fault -d mode=stream-huge:64
curl -s --limit-rate 2M --max-time 0.5 -o /dev/null "$B/oauth/token" -d x=1
sleep 0.3
sent=$(stat stream_bytes_sent)
check "stream-huge:64 abandoned: streams_aborted" "1" "$(stat streams_aborted)"
check "bytes sent before the client went away: some, not all ($sent)" "True" "$(python3 -c "print(0 < $sent < 64 << 20)")"
fault -d mode=stream-huge-chunked:2
got=$(curl -s -D "$work/headers" -o "$work/body" -w "%{size_download}" "$B/oauth/token" -d x=1)
check "stream-huge-chunked:2 read whole" "2097152" "$got"
check "chunked, no Content-Length" "chunked " \
    "$(tr -d '\r' <"$work/headers" | awk -F': ' 'tolower($1)=="transfer-encoding" {print $2} tolower($1)=="content-length" {print "length"}' | tr '\n' ' ')"
fault -d mode=stream-huge-chunked:64
curl -s --limit-rate 2M --max-time 0.5 -o /dev/null "$B/oauth/token" -d x=1
sleep 0.3
check "stream-huge-chunked:64 abandoned" "2" "$(stat streams_aborted)"

echo "== gzip-bomb"
fault -d mode=gzip-bomb -d count=2
curl -s -D "$work/headers" -o "$work/bomb.gz" "$B/oauth/token" -d x=1
check "Content-Encoding: gzip" "gzip" "$(tr -d '\r' <"$work/headers" | awk -F': ' 'tolower($1)=="content-encoding" {print $2}')"
size=$(wc -c <"$work/bomb.gz")
check "under 1 MiB on the wire ($size bytes)" "True" "$(python3 -c "print(900_000 < $size < 1 << 20)")"
check "a valid gzip (CRC, size)" "0" "$(gzip -t "$work/bomb.gz"; echo $?)"
inflated=$(gzip -dc "$work/bomb.gz" | wc -c)
check "inflates to ~1 GB ($inflated bytes)" "True" "$(python3 -c "print($inflated > 1_000_000_000)")"
check "of token JSON" '{"access_token": "tok-bomb"' "$(gzip -dc "$work/bomb.gz" | head -c 27)"
check "no Accept-Encoding sent: recorded as none" "gzip-bomb None" \
    "$(curl -s "$B/__last_request" | json "d['fault'], d['headers'].get('Accept-Encoding')" | tr -d "(),'")"
curl -s -H 'Accept-Encoding: identity' -o /dev/null "$B/oauth/token" -d x=1
check "Accept-Encoding: identity recorded" "identity" "$(curl -s "$B/__last_request" | json "d['headers'].get('Accept-Encoding')")"
check "gzip_bombs_served" "2" "$(stat gzip_bombs_served)"

echo "== echo and echo-200"
fault -d mode=echo
curl -s -D "$work/headers" -o "$work/body" "$B/oauth/token" -d grant_type=refresh_token \
    -d 'refresh_token=rt/é x' -d client_id=sessionflow-confidential -d client_secret=s3cret
check "400, error = the refresh token" "rt/é x" "$(json "d['error']" <"$work/body")"
missing=$(python3 - "$work/body" <<'EOF'
import json, sys
description = json.load(open(sys.argv[1]))["error_description"]
pieces = ["rt/é x", "rt%2F%C3%A9+x", "%72%74%2F%C3%A9%20%78", "%72%74%2f%c3%a9%20%78", "rt\\/\\u00e9 x",
          "\\u0072\\u0074\\u002f\\u00e9\\u0020\\u0078", "s3cret", "\u001b]0;pwned\u0007\u001b[2J session OK"]
print(" ".join(ascii(p) for p in pieces if p not in description) or "none")
EOF
)
check "description: raw, form, %XX, %xx, JSON-escaped, \\u, client secret, terminal sequence; missing" "none" "$missing"
check "X-Echo header" "rt/%C3%A9%20x" "$(tr -d '\r' <"$work/headers" | awk -F': ' '$1=="X-Echo" {print $2}')"
check "WWW-Authenticate echoes it" "1" "$(tr -d '\r' <"$work/headers" | grep -c 'WWW-Authenticate: Bearer error="rt/%C3%A9%20x"')"
fault -d mode=echo -d endpoint=revoke
check "echo on revoke: the token sent, Basic client secret" "AbC123 s3cret" \
    "$(curl -s "$B/oauth/revoke" -u sessionflow-confidential:s3cret -d token=AbC123 | json "d['error'], d['error_description'].split(' ')[-4]" | tr -d "(),'")"
fault -d mode=echo-200
check "echo-200: token_type = the refresh token" "200 rt-plain-1" \
    "$(refresh rt-plain-1 -w ' %{http_code}' | python3 -c "import json,sys; t=sys.stdin.read(); b,c=t.rsplit(' ',1); print(c, json.loads(b)['token_type'])")"
check "echoes_served" "3" "$(stat echoes_served)"

echo "== /__last_request and /__requests"
refresh some-token >/dev/null
check "/__last_request: method, path, form" "POST /oauth/token some-token None" \
    "$(curl -s "$B/__last_request" | json "d['method'], d['path'], d['form']['refresh_token'], d['fault']" | tr -d "(),'")"
check "/__requests holds them in order" "True" "$(curl -s "$B/__requests" | json "len(d) > 20 and d[-1]['form'].get('refresh_token') == 'some-token'")"

echo "== metadata (discovery): RFC 8414 and OpenID Connect documents, and their faults"
check "RFC 8414: issuer, token, revocation, introspection, device, authorization" \
    "$B $B/oauth/token $B/oauth/revoke $B/oauth/introspect $B/oauth/device_authorization $B/oauth/authorize" \
    "$(curl -s "$B/.well-known/oauth-authorization-server" | json "' '.join([d['issuer'], d['token_endpoint'], d['revocation_endpoint'], d['introspection_endpoint'], d['device_authorization_endpoint'], d['authorization_endpoint']])")"
check "RFC 8414 with a path: the issuer has it" "$B/tenant/a" \
    "$(curl -s "$B/.well-known/oauth-authorization-server/tenant/a" | json "d['issuer']")"
check "OpenID Connect: issuer and userinfo" "$B/tenant $B/api/me" \
    "$(curl -s "$B/tenant/.well-known/openid-configuration" | json "d['issuer'] + ' ' + d['userinfo_endpoint']")"
fault -d mode=set:issuer=https://other.example -d endpoint=metadata
check "set:issuer" "https://other.example $B/oauth/token" \
    "$(curl -s "$B/.well-known/oauth-authorization-server" | json "d['issuer'] + ' ' + d['token_endpoint']")"
fault -d mode=set-json:token_endpoint=42 -d endpoint=openid
check "set-json:token_endpoint=42 (openid)" "42" "$(curl -s "$B/.well-known/openid-configuration" | json "d['token_endpoint']")"
fault -d mode=drop:token_endpoint -d endpoint=metadata
check "drop:token_endpoint" "False $B" \
    "$(curl -s "$B/.well-known/oauth-authorization-server" | json "str('token_endpoint' in d) + ' ' + d['issuer']")"
fault -d mode=status:404 -d endpoint=metadata
check "status:404 on metadata, openid untouched" "404 200" \
    "$(curl -s -o /dev/null -w '%{http_code}' "$B/.well-known/oauth-authorization-server") $(curl -s -o /dev/null -w '%{http_code}' "$B/.well-known/openid-configuration")"
fault -d mode=redirect:302 -d endpoint=metadata
check "redirect:302 on metadata" "302" "$(curl -s -o /dev/null -w '%{http_code}' "$B/.well-known/oauth-authorization-server")"
check "metadata requests recorded" "GET /.well-known/oauth-authorization-server redirect:302" \
    "$(curl -s "$B/__last_request" | json "d['method'], d['path'], d['fault']" | tr -d "(),'")"
check "metadata_requests openid_requests" "6 3" "$(stat metadata_requests) $(stat openid_requests)"
echo "== device authorization grant (RFC 8628): pending, slow_down, approve, deny, expiry"
device() { curl -s "$B/oauth/device_authorization" -d client_id=sessionflow-public -d scope=profile; }
poll() { curl -s "$B/oauth/token" -d client_id=sessionflow-public -d grant_type=urn:ietf:params:oauth:grant-type:device_code -d device_code="$1"; }
check "config" "1 60 2" "$(curl -s "$B/__device/config" -d reset=1 -d interval=1 -d expires_in=60 -d slow_down=2 | json "d['interval'], d['expires_in'], d['slow_down']" | tr -d "(),'")"
answer=$(device)
check "the device answer" "1 60 True True" "$(echo "$answer" | json "d['interval'], d['expires_in'], d['verification_uri'].endswith('/device'), d['user_code'] in d['verification_uri_complete']" | tr -d "(),'")"
dc=$(echo "$answer" | json "d['device_code']")
uc=$(echo "$answer" | json "d['user_code']")
check "slow_down twice, then pending" "slow_down slow_down authorization_pending" \
    "$(for _ in 1 2 3; do poll "$dc" | json "d['error']"; done | tr '\n' ' ' | sed 's/ $//')"
check "an unknown user code cannot be approved" "404" "$(curl -s -o /dev/null -w '%{http_code}' "$B/__device/approve" -d user_code=NOPE-NOPE)"
curl -s "$B/__device/approve" -d user_code="$uc" >/dev/null
check "approved: tokens" "Bearer True" "$(poll "$dc" | json "d['token_type'], bool(d['refresh_token'])" | tr -d "(),'")"
check "the device code is used up" "invalid_request" "$(poll "$dc" | json "d['error']")"
dc=$(device | tee "$work/device.json" | json "d['device_code']")
curl -s "$B/__device/deny" -d user_code="$(json "d['user_code']" <"$work/device.json")" >/dev/null
check "denied: access_denied" "access_denied" "$(poll "$dc" | json "d['error']")"
curl -s "$B/__device/config" -d lifetime=0.2 >/dev/null
dc=$(device | json "d['device_code']")
sleep 0.4
check "a code past its lifetime: expired_token" "expired_token" "$(poll "$dc" | json "d['error']")"
check "/__device/stats: requests, slow_downs, pending, denied, expired, granted" "3 2 1 1 1 1" \
    "$(curl -s "$B/__device/stats" | json "d['device_requests'], d['slow_downs'], d['pending'], d['denied'], d['expired'], d['granted']" | tr -d "(),'")"
curl -s "$B/__device/config" -d reset=1 >/dev/null

echo "== authorization code + PKCE (RFC 6749 §4.1, RFC 7636), loopback redirect (RFC 8252 §7.3)"
verifier=$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')
challenge=$(printf %s "$verifier" | python3 -c 'import sys,hashlib,base64; print(base64.urlsafe_b64encode(hashlib.sha256(sys.stdin.read().encode()).digest()).rstrip(b"=").decode())')
cb="http://127.0.0.1:45678/callback"
authorize() { curl -s -G "$B/oauth/authorize" -d response_type=code -d client_id=sessionflow-public --data-urlencode "redirect_uri=$1" -d state=st8 -d code_challenge="$challenge" -d code_challenge_method=S256 -d scope=profile; }
page=$(authorize "$cb")
check "the consent page carries the request as hidden fields" "True True" \
    "$(python3 -c 'import sys; p=sys.stdin.read(); print("name=\"state\" value=\"st8\"" in p, "value=\"allow\"" in p)' <<<"$page")"
form=$(python3 -c 'import re,sys,urllib.parse; print(urllib.parse.urlencode(re.findall(r"<input type=\"hidden\" name=\"([^\"]*)\" value=\"([^\"]*)\">", sys.stdin.read())))' <<<"$page")
location=$(curl -s -o /dev/null -w '%{redirect_url}' "$B/oauth/authorize" -d "$form" -d consent=allow)
check "allow: a redirect to the loopback URI with the code and the state" "http://127.0.0.1:45678/callback st8 True" \
    "$(python3 -c 'import sys,urllib.parse as u; s=u.urlsplit(sys.argv[1]); q=u.parse_qs(s.query); print(s.scheme+"://"+s.netloc+s.path, q["state"][0], len(q["code"][0]) > 20)' "$location")"
code=$(python3 -c 'import sys,urllib.parse as u; print(u.parse_qs(u.urlsplit(sys.argv[1]).query)["code"][0])' "$location")
exchange() { curl -s "$B/oauth/token" -d grant_type=authorization_code -d client_id=sessionflow-public -d code="$code" --data-urlencode "redirect_uri=$cb" -d code_verifier="$1"; }
check "a wrong verifier: invalid_grant" "invalid_grant" "$(exchange "${verifier}x" | json "d['error']")"
check "the right verifier: tokens" "Bearer True" "$(exchange "$verifier" | json "d['token_type'], bool(d['refresh_token'])" | tr -d "(),'")"
check "a code is good once" "invalid_grant" "$(exchange "$verifier" | json "d['error']")"
location=$(curl -s -o /dev/null -w '%{redirect_url}' "$B/oauth/authorize" -d "$form" -d consent=deny)
check "deny: error=access_denied with the state" "access_denied st8" \
    "$(python3 -c 'import sys,urllib.parse as u; q=u.parse_qs(u.urlsplit(sys.argv[1]).query); print(q["error"][0], q["state"][0])' "$location")"
check "a redirect URI that is not loopback: 400, no redirect" "400 " \
    "$(curl -s -o /dev/null -w '%{http_code} %{redirect_url}' -G "$B/oauth/authorize" -d response_type=code -d client_id=sessionflow-public --data-urlencode "redirect_uri=http://evil.example:45678/callback" -d state=s -d code_challenge="$challenge" -d code_challenge_method=S256)"
check "/__authorize/stats: pages, consents, denials, issued, exchanges, refused" "2 1 1 1 3 1" \
    "$(curl -s "$B/__authorize/stats" | json "d['authorize_pages'], d['consents'], d['denials'], d['codes_issued'], d['code_exchanges'], d['codes_refused']" | tr -d "(),'")"

echo "== --strict-reuse: any rotated refresh token replayed revokes the grant"
start strict --strict-reuse
tokens=$(signin)
rt=$(echo "$tokens" | json "d['refresh_token']")
got=$(refresh "$rt")
check "the old token again: invalid_grant" "invalid_grant" "$(refresh "$rt" | json "d['error']")"
check "... and the new one is dead too" "invalid_grant" "$(refresh "$(echo "$got" | json "d['refresh_token']")" | json "d['error']")"
check "reuse_detected" "1" "$(stat reuse_detected)"

if grep -q Traceback "$work"/*.err; then
    failed=$((failed + 1))
    echo "FAIL the server raised:"
    grep -A20 Traceback "$work"/*.err | head -40
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
