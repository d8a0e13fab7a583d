import Foundation
import Synchronization
import Testing

@testable import LoopFlow

@discardableResult
/// Runs `body` with a fresh owned loop and shuts it down afterwards.
func withLoop<T>(
    clock: LoopClock = .system,
    _ body: (EventLoop) async throws -> T
) async throws -> T {
    let loop = try EventLoop(name: "test-loop", clock: clock)
    do {
        let result = try await body(loop)
        _ = try? loop.shutdown()
        return result
    } catch {
        _ = try? loop.shutdown()
        throw error
    }
}

/// Thread-safe list of what callbacks saw.
final class Recorder<Element: Sendable>: @unchecked Sendable {
    private let box = LockedBox<[Element]>([])

    func append(_ element: Element) { box.withLockedValue { $0.append(element) } }
    var all: [Element] { box.withLockedValue { $0 } }
    var count: Int { box.withLockedValue { $0.count } }
    var last: Element? { box.withLockedValue { $0.last } }
}

/// A counter any thread can bump.
final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    @discardableResult
    func increment() -> Int { value.add(1, ordering: .relaxed).newValue }
    @discardableResult
    func decrement() -> Int { value.subtract(1, ordering: .relaxed).newValue }
    var current: Int { value.load(ordering: .relaxed) }
}

/// A flag any thread can set and read.
final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    func set(_ newValue: Bool = true) { value.store(newValue, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}

/// Runs `body(index)` on `count` real threads started together, and waits for all.
func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let start = Latch()
    let done = (0..<count).map { _ in Latch() }
    for index in 0..<count {
        let finished = done[index]
        let thread = Thread {
            start.wait()
            body(index)
            finished.signal()
        }
        thread.start()
    }
    start.signal()
    for latch in done { latch.wait() }
}

/// Holds the loop thread inside a job until `open()` — lets a test pile up work.
final class LoopBlocker: Sendable {
    private let entered = Latch()
    private let gate = Latch()

    init(_ loop: EventLoop) throws {
        try loop.execute { [entered, gate] in
            entered.signal()
            gate.wait()
        }
        entered.wait()
    }

    func open() { gate.signal() }
}

struct TestError: Error, Equatable {
    let tag: String
}
