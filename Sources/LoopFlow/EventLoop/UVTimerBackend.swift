import CLibUV

/// Timers on libuv's monotonic clock: one `uv_timer_t` per armed timer.
final class UVTimerBackend: TimerBackend, @unchecked Sendable {
    private unowned(unsafe) var loop: EventLoop!
    /// Loop-confined: armed timers, retained until their handle is closed.
    private var armed: [ObjectIdentifier: LoopTimer] = [:]

    func attach(to loop: EventLoop) {
        self.loop = loop
    }

    func currentTime() -> Duration {
        .nanoseconds(Int64(bitPattern: uv_hrtime()))
    }

    func start(_ timer: LoopTimer) {
        loop.assertInEventLoop()
        precondition(timer.uvHandle == nil, "timer started twice")
        let handle = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
        uv_timer_init(loop.uvLoop, handle)
        handle.pointee.data = Unmanaged.passUnretained(timer).toOpaque()
        timer.uvHandle = UnsafeMutableRawPointer(handle)
        armed[ObjectIdentifier(timer)] = timer
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
