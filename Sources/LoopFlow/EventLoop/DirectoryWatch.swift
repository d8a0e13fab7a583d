import CLibUV

/// Watches a directory with `uv_fs_event` and calls `onChange` on the loop thread, at most
/// once per `debounce` however many changes arrive in a burst.
///
/// It watches the *directory*, not a file: an atomic replace (write a temporary file,
/// rename it over) gives the file a new inode, and a watch on the old inode would go
/// silent at the first rename.
public final class DirectoryWatch: @unchecked Sendable {
    let loop: EventLoop
    let path: String
    let debounce: Duration
    private let onChange: @Sendable () -> Void
    // Loop-confined.
    private var handle: UnsafeMutablePointer<uv_fs_event_t>?
    private var pending: LoopTimer?
    private var stopped = false

    init(loop: EventLoop, path: String, debounce: Duration, onChange: @escaping @Sendable () -> Void) {
        self.loop = loop
        self.path = path
        self.debounce = debounce
        self.onChange = onChange
    }

    /// Loop thread: starts watching. Returns a libuv error code (0 on success).
    func start() -> Int32 {
        let handle = UnsafeMutablePointer<uv_fs_event_t>.allocate(capacity: 1)
        uv_fs_event_init(loop.uvLoop, handle)
        handle.pointee.data = Unmanaged.passRetained(self).toOpaque()
        let rc = uv_fs_event_start(handle, directoryChanged, path, 0)
        self.handle = handle
        if rc != 0 {
            closeHandle()
        }
        return rc
    }

    fileprivate func changed() {
        guard !stopped, pending == nil else { return }
        pending = try? loop.scheduleTimer(after: debounce) { [self] in
            pending = nil
            guard !stopped else { return }
            onChange()
        }
    }

    /// Stops watching. Safe from any thread, any number of times; from the loop thread,
    /// `onChange` does not run after this returns.
    public func cancel() {
        if loop.inEventLoop {
            stopOnLoop()
        } else {
            try? loop.enqueue(.run { [self] in stopOnLoop() }, isInternal: true)
        }
    }

    func stopOnLoop() {
        guard !stopped else { return }
        stopped = true
        pending?.cancel()
        pending = nil
        closeHandle()
        loop.resources.forgetWatch(self)
    }

    private func closeHandle() {
        guard let handle else { return }
        self.handle = nil
        uv_fs_event_stop(handle)
        uv_close(UnsafeMutableRawPointer(handle).assumingMemoryBound(to: uv_handle_t.self)) { raw in
            guard let raw else { return }
            if let data = raw.pointee.data {
                Unmanaged<DirectoryWatch>.fromOpaque(data).release()
            }
            raw.deallocate()
        }
    }
}

private func directoryChanged(
    _ handle: UnsafeMutablePointer<uv_fs_event_t>?, _ filename: UnsafePointer<CChar>?, _ events: Int32, _ status: Int32
) {
    guard let data = handle?.pointee.data else { return }
    Unmanaged<DirectoryWatch>.fromOpaque(data).takeUnretainedValue().changed()
}

extension EventLoop {
    /// Watches `directory` for changes (files created, replaced, removed), calling
    /// `onChange` on the loop thread at most once per `debounce`. Teardown stops it.
    ///
    /// - Throws: `loopShutDown`; `libuv` if the directory cannot be watched.
    public func watchDirectory(
        _ directory: String, debounce: Duration = .milliseconds(50),
        _ onChange: @escaping @Sendable () -> Void
    ) async throws(LoopFlowError) -> DirectoryWatch {
        let watch = DirectoryWatch(loop: self, path: directory, debounce: debounce, onChange: onChange)
        let started: Result<Int32, LoopFlowError> = await withCheckedContinuation { continuation in
            do throws(LoopFlowError) {
                try execute { [self] in
                    let rc = watch.start()
                    if rc == 0 { resources.rememberWatch(watch) }
                    continuation.resume(returning: .success(rc))
                }
            } catch {
                continuation.resume(returning: .failure(error))
            }
        }
        let rc = try started.get()
        guard rc == 0 else {
            throw LoopFlowError(.libuv, "cannot watch \(directory): \(String(cString: uv_strerror(rc)))")
        }
        return watch
    }

    /// The same, from the loop thread, synchronously.
    public func watchDirectoryNow(
        _ directory: String, debounce: Duration = .milliseconds(50),
        _ onChange: @escaping @Sendable () -> Void
    ) throws(LoopFlowError) -> DirectoryWatch {
        preconditionInEventLoop()
        guard acceptsWork else { throw LoopFlowError(.loopShutDown, "the event loop '\(name)' is shut down") }
        let watch = DirectoryWatch(loop: self, path: directory, debounce: debounce, onChange: onChange)
        let rc = watch.start()
        guard rc == 0 else {
            throw LoopFlowError(.libuv, "cannot watch \(directory): \(String(cString: uv_strerror(rc)))")
        }
        resources.rememberWatch(watch)
        return watch
    }
}
