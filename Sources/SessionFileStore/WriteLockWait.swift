import LoopFlow

#if canImport(Glibc)
import Glibc
#endif

/// How a change waits for `<store>.wlock` (`FileCredentialStore.withWriteLock`).
///
/// It runs on the session's store worker, never on a loop thread (`StoreWorker`), so it may
/// sleep. It does not spin: a busy lock is tried again after a sleep that doubles from 1 ms
/// to 32 ms — about 70 looks over the whole patience, against 2 000 for the fixed 1 ms
/// polling it replaced — and gives up when `patience` has passed (a stopped holder must not
/// hold the session's store work for ever: the change fails as unavailable and the session
/// retries it). Not a blocking `flock(LOCK_EX)`: it cannot be given a deadline without a
/// signal, and a thread left blocked on a holder that never lets go would be a thread lost.
enum WriteLockWait {
    /// Locks `fd` exclusively within `patience`. Nil when locked, else the errno that stopped
    /// it (`EWOULDBLOCK`: the patience ran out while another process held it).
    static func lockExclusively(_ fd: Int32, patience: Duration) -> Int32? {
        let deadline = monotonicNow() + patience
        var pause = Duration.milliseconds(1)
        while true {
            if flock(fd, LOCK_EX | LOCK_NB) == 0 { return nil }
            let failure = errno
            guard failure == EWOULDBLOCK || failure == EINTR else { return failure }
            let left = deadline - monotonicNow()
            guard left > .zero else { return EWOULDBLOCK }
            sleep(for: min(pause, left))
            pause = min(pause * 2, .milliseconds(32))
        }
    }

    private static func monotonicNow() -> Duration {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return .seconds(Int64(now.tv_sec)) + .nanoseconds(Int64(now.tv_nsec))
    }

    private static func sleep(for duration: Duration) {
        let (seconds, attoseconds) = duration.components
        var request = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
        var remaining = timespec()
        while nanosleep(&request, &remaining) != 0 && errno == EINTR { request = remaining }
    }
}
