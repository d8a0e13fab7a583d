// What a script pays for `watch-session token` (issue 27, point 9): the median wall time of a
// `token` process that answers from a valid stored token (real file store, no request) against
// `watch-session --version` in the same run (process start and the binary's load: the floor),
// and the stripped size of the CLI against its budget.
import CBaseline
import SessionCore
import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

/// Runs `arguments` (the first is the executable) with stdin, stdout and stderr on /dev/null;
/// returns the wall time in nanoseconds and whether it exited 0.
func timedRun(_ arguments: [String]) -> (nanoseconds: UInt64, ok: Bool) {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    for descriptor in [STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO] {
        posix_spawn_file_actions_addopen(&actions, descriptor, "/dev/null", descriptor == STDIN_FILENO ? O_RDONLY : O_WRONLY, 0)
    }
    var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    var pid: pid_t = 0
    let started = bl_now_ns()
    guard posix_spawn(&pid, arguments[0], &actions, nil, &argv, environ) == 0 else { return (0, false) }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let elapsed = bl_now_ns() - started
    // WIFEXITED && WEXITSTATUS == 0
    return (elapsed, status & 0x7f == 0 && (status >> 8) & 0xff == 0)
}

/// The two rows: `token` vs `--version` (median of `runs` each, interleaved), and the size of
/// `strip -o` of the binary.
func cliRows(watchSession: String, runs: Int) -> [Row] {
    var rows: [Row] = []
    let directory = "/tmp/loopflow-bench-store-\(getpid())"
    defer { _ = timedRun(["/bin/rm", "-rf", directory]) }
    do {
        // A valid token for an hour: `token` prints it without a request (the issuer is a
        // closed port: a refresh would fail, and the run would say so).
        try FileCredentialStore(directory: directory).write(StoredSession(
            accessToken: Secret("bench-access-token"), refreshToken: Secret("bench-refresh-token"),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "bench",
            profile: SessionProfile(
                issuer: "http://127.0.0.1:9", clientID: "bench", tokenEndpoint: "http://127.0.0.1:9/oauth/token")))
    } catch {
        note("watch-session token: the store could not be written: \(error)")
        return [Row(name: "watch-session token (valid stored token), median wall", ours: .nan, floor: .nan, unit: "ms",
                    note: "store not written")]
    }
    var token: [Double] = [], version: [Double] = []
    var failed = false
    _ = timedRun([watchSession, "--version"])  // the first run pages the binary in
    for _ in 0..<runs {
        let floor = timedRun([watchSession, "--version"])
        let ours = timedRun([watchSession, "token", "--store", directory])
        failed = failed || !floor.ok || !ours.ok
        version.append(Double(floor.nanoseconds) / 1e6)
        token.append(Double(ours.nanoseconds) / 1e6)
    }
    rows.append(Row(
        name: "watch-session token (valid stored token), median wall", ours: failed ? .nan : median(token),
        floor: failed ? .nan : median(version), unit: "ms", target: .ratioAtMost(2),
        baseline: "watch-session --version", note: failed ? "a run did not exit 0" : nil))

    let stripped = "/tmp/loopflow-bench-watch-session-\(getpid())"
    defer { unlink(stripped) }
    var size = Double.nan
    if timedRun(["/usr/bin/strip", "-o", stripped, watchSession]).ok {
        var info = stat()
        if stat(stripped, &info) == 0 { size = Double(info.st_size) / 1_000_000 }
    }
    rows.append(Row(
        name: "watch-session stripped size", ours: size, floor: .nan, unit: "MB", target: .atMost(25),
        baseline: "budget", note: size.isFinite ? nil : "strip failed (binutils)"))
    return rows
}
