import DequeModule

/// A flow's values or events as an `AsyncSequence`.
///
/// Each iterator holds its own subscription, made when the iterator is made. Cancelling
/// the iterating task, or dropping the iterator (leaving the `for await` loop), closes it.
public struct FlowValues<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = Never

    let policy: AsyncViewBuffer<Element>.Policy
    let subscribe: @Sendable (AsyncViewBuffer<Element>) throws -> FlowSubscription

    init(
        _ kind: AsyncViewBuffer<Element>.Policy.Kind,
        isEqual: (@Sendable (Element, Element) -> Bool)? = nil,
        subscribe: @escaping @Sendable (AsyncViewBuffer<Element>) throws -> FlowSubscription
    ) {
        self.policy = .init(kind: kind, isEqual: isEqual)
        self.subscribe = subscribe
    }

    public func makeAsyncIterator() -> Iterator {
        let buffer = AsyncViewBuffer<Element>(policy: policy)
        do {
            buffer.attach(try subscribe(buffer))
        } catch {
            // The loop is shut down: the sequence is empty.
            buffer.finish()
        }
        return Iterator(buffer: buffer)
    }

    public struct Iterator: AsyncIteratorProtocol {
        let buffer: AsyncViewBuffer<Element>

        public mutating func next() async -> Element? {
            await buffer.next()
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async -> Element? {
            await buffer.next()
        }
    }
}

/// A flow's values or events as an `AsyncSequence` that tells a failure from an end: a
/// terminal error (`finish(throwing:)`, a flow's `onError`) is thrown by `next()` once the
/// elements before it are consumed; completion ends it with nil, as does cancelling the
/// iterating task (no error is thrown for a cancellation). A loop already shut down when the
/// iterator is made throws `LoopFlowError.loopShutDown`. Otherwise as `FlowValues`.
public struct ThrowingFlowValues<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = any Error

    let values: FlowValues<Element>

    public func makeAsyncIterator() -> Iterator {
        let buffer = AsyncViewBuffer<Element>(policy: values.policy)
        do {
            buffer.attach(try values.subscribe(buffer))
        } catch {
            buffer.finish(throwing: error)
        }
        return Iterator(buffer: buffer)
    }

    public struct Iterator: AsyncIteratorProtocol {
        let buffer: AsyncViewBuffer<Element>

        public mutating func next() async throws -> Element? {
            try await buffer.nextThrowing()
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async throws(any Error) -> Element? {
            try await buffer.nextThrowing()
        }
    }
}

/// Where loop-thread callbacks leave elements for an async consumer on another thread.
public final class AsyncViewBuffer<Element: Sendable>: @unchecked Sendable {
    struct Policy: Sendable {
        enum Kind: Sendable {
            /// Keep only the latest element, and never hand out one equal to the last.
            case latestDistinct
            /// Keep up to `capacity` elements; overflow drops as the flow's policy says.
            case bounded(Int, BufferOverflow)
        }
        let kind: Kind
        let isEqual: (@Sendable (Element, Element) -> Bool)?
    }

    private let policy: Policy
    private let lock = Lock()
    // Guarded by lock.
    private var items = Deque<Element>()
    private var lastYielded: Element?
    private var waiter: CheckedContinuation<Element?, Never>?
    private var done = false
    /// The terminal error, for the throwing view (thrown once, after the elements before it).
    private var failure: (any Error)?
    private var cancelled = false
    private var subscription: FlowSubscription?
    private var dropped = 0

    init(policy: Policy) {
        self.policy = policy
    }

    deinit {
        subscription?.close()
    }

    /// Elements this consumer lost to its full buffer.
    var droppedElements: Int { lock.withLock { dropped } }

    func attach(_ subscription: FlowSubscription) {
        let closeNow: Bool = lock.withLock {
            guard !done else { return true }
            self.subscription = subscription
            return false
        }
        if closeNow { subscription.close() }
    }

    /// Loop thread: a new element.
    func push(_ element: Element) {
        lock.lock()
        if done {
            lock.unlock()
            return
        }
        if let waiter {
            self.waiter = nil
            lastYielded = element
            lock.unlock()
            waiter.resume(returning: element)
            return
        }
        switch policy.kind {
        case .latestDistinct:
            items.removeAll(keepingCapacity: true)
            if let lastYielded, let isEqual = policy.isEqual, isEqual(lastYielded, element) {
                break  // back to what the consumer already has: nothing is pending
            }
            items.append(element)
        case .bounded(let capacity, let overflow):
            if items.count >= capacity {
                dropped += 1
                switch overflow {
                case .dropOldest: items.removeFirst()
                case .dropLatest:
                    lock.unlock()
                    return
                }
            }
            items.append(element)
        }
        lock.unlock()
    }

    /// The flow ended: the consumer drains what is buffered, then gets nil (the throwing
    /// view: `error`, if the flow failed).
    func finish(throwing error: (any Error)? = nil) {
        lock.lock()
        if !done, let error { failure = error }
        done = true
        let waiter = self.waiter
        self.waiter = nil
        lock.unlock()
        waiter?.resume(returning: nil)
    }

    /// Cancelled or abandoned: stop now and close the subscription — without waiting for a
    /// callback the loop may be in: this runs in the task's cancellation handler, under the
    /// task's status lock, and that callback may be resuming this task's continuation, which
    /// takes the same lock. (Nothing needs the wait: a late `push` or `finish` sees `done`.)
    func cancel() {
        lock.lock()
        done = true
        cancelled = true
        items.removeAll()
        let waiter = self.waiter
        self.waiter = nil
        let subscription = self.subscription
        self.subscription = nil
        lock.unlock()
        waiter?.resume(returning: nil)
        subscription?.closeWithoutWaiting()
    }

    /// `next()`, then the terminal error once the elements are drained (never after a
    /// cancellation).
    func nextThrowing() async throws -> Element? {
        if let element = await next() { return element }
        let error: (any Error)? = lock.withLock {
            defer { failure = nil }
            return cancelled ? nil : failure
        }
        if let error { throw error }
        return nil
    }

    func next() async -> Element? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Element?, Never>) in
                lock.lock()
                if let element = items.popFirst() {
                    lastYielded = element
                    lock.unlock()
                    continuation.resume(returning: element)
                } else if done || Task.isCancelled {
                    lock.unlock()
                    continuation.resume(returning: nil)
                } else {
                    precondition(waiter == nil, "one consumer per iterator")
                    waiter = continuation
                    lock.unlock()
                }
            }
        } onCancel: {
            cancel()
        }
    }
}
