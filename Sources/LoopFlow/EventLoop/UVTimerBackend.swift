import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// Timers on libuv's monotonic clock: one `uv_timer_t` per armed timer.
final class UVTimerBackend: TimerBackend, @unchecked Sendable {
    private unowned(unsafe) var loop: EventLoop!
    /// Loop-confined: armed timers, retained until their handle is closed.
    private var armed: [ObjectIdentifier: LoopTimer] = [:]

    func attach(to loop: EventLoop) {
        self.loop = loop
    }

    /// CLOCK_BOOTTIME: monotonic (wall-clock changes do not move it) and, unlike libuv's
    /// CLOCK_MONOTONIC, it keeps counting while the machine is suspended — so a token
    /// that expired while a laptop slept is seen as expired when it wakes. (libuv's timers
    /// still follow CLOCK_MONOTONIC: a timer due during a suspend fires after it.)
    func currentTime() -> Duration {
        var now = timespec()
        clock_gettime(CLOCK_BOOTTIME, &now)
        return .nanoseconds(Int64(now.tv_sec) &* 1_000_000_000 &+ Int64(now.tv_nsec))
    }

    func start(_ timer: LoopTimer) {
        loop.assertInEventLoop()
        precondition(timer.uvHandle == nil, "timer started twice")
        let handle = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
        uv_timer_init(loop.uvLoop, handle)
        handle.pointee.data = Unmanaged.passUnretained(timer).toOpaque()
        timer.uvHandle = UnsafeMutableRawPointer(handle)
        armed[ObjectIdentifier(timer)] = timer
        // libuv counts the delay from the time it cached when this loop iteration began, which
        // a long iteration leaves behind by as much as it lasted: a 200 ms refresh timeout armed
        // late in a 10 ms turn would fire 190 ms after the request went out. Now, not then.
        uv_update_time(loop.uvLoop)
        uv_timer_start(
            handle, uvTimerFired,
            timer.delay.roundedUpMilliseconds,
            timer.interval.map { max($0.roundedUpMilliseconds, 1) } ?? 0)
    }

    func fired(_ timer: LoopTimer) {
        if timer.interval == nil {
            stop(timer)
        }
    }

    func stop(_ timer: LoopTimer) {
        loop.assertInEventLoop()
        guard let raw = timer.uvHandle, armed.removeValue(forKey: ObjectIdentifier(timer)) != nil else { return }
        let handle = raw.assumingMemoryBound(to: uv_timer_t.self)
        uv_timer_stop(handle)
        // The handle keeps the timer alive until libuv is done with it.
        handle.pointee.data = Unmanaged.passRetained(timer).toOpaque()
        uv_close(raw.assumingMemoryBound(to: uv_handle_t.self), uvTimerClosed)
    }

    func stopAll() {
        for timer in Array(armed.values) {
            stop(timer)
        }
    }
}

private func uvTimerFired(_ handle: UnsafeMutablePointer<uv_timer_t>?) {
    guard let data = handle?.pointee.data else { return }
    Unmanaged<LoopTimer>.fromOpaque(data).takeUnretainedValue().fire()
}

private func uvTimerClosed(_ handle: UnsafeMutablePointer<uv_handle_t>?) {
    guard let handle else { return }
    if let data = handle.pointee.data {
        let timer = Unmanaged<LoopTimer>.fromOpaque(data).takeRetainedValue()
        timer.uvHandle = nil
    }
    handle.deallocate()
}
