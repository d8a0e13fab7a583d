import Synchronization

/// The handle `subscribe` returns. Close it when you no longer want callbacks.
///
/// The contract (docs/ARCHITECTURE.md, "The threading and lifetime contract"):
/// - every callback runs on the loop thread, never inside the call that caused it and
///   never while a library lock is held;
/// - `close()` is safe from any thread, any number of times. When it returns, no callback
///   of this subscription is running or will start — except when called from inside this
///   subscription's own callback: that callback finishes and nothing follows it. (Off the
///   loop thread it waits for the loop to finish the walk over this flow's subscribers it
///   may be in: one flag check per callback instead of a lock or two atomic updates.);
/// - `onRelease` runs exactly once, on the loop thread, after the last callback;
/// - `onError` / `onComplete` are terminal: at most one of them, once.
///
/// The one way to deadlock: calling `close()` from a thread that a running callback of the
/// same flow is itself waiting for (the callback blocks on that thread, the thread blocks
/// in `close()` until the walk over the flow's subscribers ends).
///
/// Dropping the handle does not close the subscription (as with a Kotlin
/// `FlowSubscription`): it stays open until `close()` or loop teardown, which reports it
/// as never closed. The `values` async sequences close for you.
public struct FlowSubscription: Sendable, Hashable, CustomStringConvertible {
    private static let nextID = Atomic<UInt64>(1)

    /// Unique within the process; never reused.
    public let id: UInt64
    /// The flow's core, which keeps the record's page alive for as long as this handle.
    let core: FlowCore
    /// The subscriber's record (see `SubscriberEntry`): the handle's id is in its tag until
    /// the record is recycled.
    let entry: SubscriberEntry
    let slot: Int32

    /// How many ids a flow takes from the process-wide counter at a time (see `reserveIDs`).
    static let idBlock: UInt64 = 1024

    /// The first of `idBlock` fresh ids (ids are never reused, so a recycled record never
    /// matches an old handle). A flow hands them out under its own lock: one atomic add per
    /// block instead of one per subscribe. Wrapping: a checked add compiles to a
    /// compare-and-swap loop; the 2^59 ids a tag holds do not run out.
    static func reserveIDs() -> UInt64 { nextID.wrappingAdd(idBlock, ordering: .relaxed).oldValue }

    init(core: FlowCore, entry: SubscriberEntry, slot: Int32, id: UInt64) {
        self.core = core
        self.entry = entry
        self.slot = slot
        self.id = id
    }

    var loop: EventLoop { core.loop }

    public var description: String { "FlowSubscription(\(id)\(isClosed ? ", closed" : ""))" }

    public static func == (lhs: FlowSubscription, rhs: FlowSubscription) -> Bool { lhs.id == rhs.id }
    public func hash(into hasher: inout Hasher) { hasher.combine(id) }

    /// Whether `close()` was called or a terminal callback was delivered.
    public var isClosed: Bool {
        let tag = entry.tag.pointee.load(ordering: .acquiring)
        return tag >> SubscriberEntry.idShift != id || tag & SubscriberEntry.closedBit != 0
    }

    /// Ends the subscription. Returns `true` if this call closed it, `false` if it was
    /// already closed (by an earlier `close()` or a terminal callback).
    ///
    /// Threading: any thread. Off the loop thread, it returns only once the loop is not in
    /// the middle of calling this flow's subscribers, so no callback of this subscription
    /// is running; the loop sees the closed tag before any later callback.
    @discardableResult
    public func close() -> Bool {
        let onLoop = core.loop.inEventLoop
        // The fields, not `self`: passing the handle (which holds `core`) to a method of
        // `core` made the compiler retain and release the core around the call. And the core
        // through a reference this handle guarantees, the call not inlined (`FlowCore.close`
        // is `@inline(never)`): either alone still left a retain and a release of the core
        // around it — two atomic operations on its count, a third of the pair's cost beside
        // its one lock (subscribe+close on the loop thread 9.7–10.2 → 13.9–14.0 M/s). Sound
        // because this method borrows the handle: its caller keeps it, and so the core, alive
        // until it returns (a `consuming` close on a noncopyable handle would not be).
        let (entry, slot, id) = (entry, slot, id)
        return Unmanaged.passUnretained(core)._withUnsafeGuaranteedRef { core in
            let closed = core.close(entry: entry, slot: slot, id: id, onLoop: onLoop)
            if !onLoop {
                core.gate.waitWhileWalking(ObjectIdentifier(core))
            }
            return closed
        }
    }

    /// `close()` without its wait: the loop skips this subscriber from its next callback on,
    /// but a callback already running may still be finishing when this returns. For closers
    /// that must not block on the loop: a task's cancellation handler runs under that task's
    /// status lock, which the loop thread needs to resume the task's continuation from inside
    /// a callback (`AsyncViewBuffer.cancel`; waiting there deadlocked both threads).
    @discardableResult
    func closeWithoutWaiting() -> Bool {
        core.close(entry: entry, slot: slot, id: id, onLoop: core.loop.inEventLoop)
    }
}

/// The optional callbacks of a subscriber, in one box made only when one of them is given:
/// most subscribers have only their value callback (kept in their record).
final class SubscriberExtras: Sendable {
    let onError: (@Sendable (any Error) -> Void)?
    let onComplete: (@Sendable () -> Void)?
    let onRelease: (@Sendable () -> Void)?

    init(
        onError: (@Sendable (any Error) -> Void)?, onComplete: (@Sendable () -> Void)?,
        onRelease: (@Sendable () -> Void)?
    ) {
        self.onError = onError
        self.onComplete = onComplete
        self.onRelease = onRelease
    }

    /// Retained, for a record; nil when no callback is given (nothing to allocate).
    static func make(
        onError: (@Sendable (any Error) -> Void)?, onComplete: (@Sendable () -> Void)?,
        onRelease: (@Sendable () -> Void)?
    ) -> UnsafeRawPointer? {
        guard onError != nil || onComplete != nil || onRelease != nil else { return nil }
        let extras = SubscriberExtras(onError: onError, onComplete: onComplete, onRelease: onRelease)
        return UnsafeRawPointer(Unmanaged.passRetained(extras).toOpaque())
    }
}

/// How a C (or any FFI) subscriber's value callback is called: one per kind of foreign
/// callback, shared by every subscriber using it. A C subscriber's record holds its function
/// pointer and userdata, and the walk calls them through `call` — no Swift closure per
/// subscriber. The first invoker a flow's C subscribers bring is that flow's usual one: the
/// flow keeps it until the flow goes (others are let go of with their last subscription), and
/// lets go of it on whichever thread lets go of the flow last — so make one per kind, not one
/// per subscription, and let its closure capture nothing that must die on the loop thread.
public final class ForeignCallback<Value>: Sendable {
    /// Calls `function` (a C function pointer of the kind this invoker knows) with the value
    /// and `userdata`.
    let call: @Sendable (Value, UnsafeRawPointer, UnsafeMutableRawPointer?) -> Void
    /// The same as a C function that takes the value by pointer (`byPointer`): the walk, which
    /// is generic and unspecialized, holds the value indirectly already, so it passes its
    /// address — no reabstraction thunk and no closure context on the way to the C callback.
    let pointerCall: (@convention(c) (UnsafeRawPointer, UnsafeRawPointer, UnsafeMutableRawPointer?) -> Void)?

    public init(_ call: @escaping @Sendable (
        _ value: Value, _ function: UnsafeRawPointer, _ userdata: UnsafeMutableRawPointer?) -> Void
    ) {
        self.call = call
        self.pointerCall = nil
    }

    private init(
        pointer: @escaping @convention(c) (UnsafeRawPointer, UnsafeRawPointer, UnsafeMutableRawPointer?) -> Void
    ) {
        self.pointerCall = pointer
        self.call = { value, function, userdata in
            withUnsafePointer(to: value) { pointer(UnsafeRawPointer($0), function, userdata) }
        }
    }

    /// An invoker that receives the value by pointer (valid for the call only; bind it to
    /// `Value`): the cheapest path from the walk to a C subscriber (the C fan-out rows).
    public static func byPointer(
        _ call: @escaping @convention(c) (
            _ value: UnsafeRawPointer, _ function: UnsafeRawPointer, _ userdata: UnsafeMutableRawPointer?) -> Void
    ) -> ForeignCallback<Value> {
        ForeignCallback(pointer: call)
    }
}

/// A Swift subscriber's value closure as a record holds it (two words at offset 8), made
/// through this one-field struct so that no reabstraction thunk is allocated: a bit cast of
/// the closure itself, in this generic code, goes through its most general form.
struct ValueCallback<Value> {
    let body: @Sendable (Value) -> Void

    @inline(__always)
    init(body: @escaping @Sendable (Value) -> Void) { self.body = body }

}

/// A Swift value closure's two words (function, context), its context retained. A free
/// function: a static one would name `ValueCallback<Value>` as its `self`, a metadata lookup
/// in this unspecialized code (as would `withExtendedLifetime` of the struct: measured, 4 %
/// of a subscribe+close in the runtime's metadata cache).
///
/// Sound because the struct's field has the parameter's own abstraction (both are
/// `(Value) -> Void` in this generic context), so building it makes no reabstraction thunk:
/// the words are the caller's closure, which the caller keeps alive for this call, and the
/// retain here makes the record's own reference. (A thunk would be a new context freed with
/// the temporary; `SubscriberRecordTests` holds a closure's captures alive until release and
/// checks they go then.)
@inline(__always)
func callbackWords<Value>(_ body: @escaping @Sendable (Value) -> Void) -> (UnsafeRawPointer?, UnsafeRawPointer?) {
    let words = unsafeBitCast(ValueCallback(body: body), to: (UnsafeRawPointer?, UnsafeRawPointer?).self)
    if let context = words.1 {
        _ = Unmanaged<AnyObject>.fromOpaque(context).retain()
    }
    return words
}

/// A subscriber's value callback as a record takes it: a Swift closure's two words (its
/// context retained), or a C function pointer and userdata with the `ForeignCallback` that
/// calls them (retained). Non-generic, so the one admission path serves every flow.
struct AdmittedCallback {
    let words: (UnsafeRawPointer?, UnsafeRawPointer?)
    let foreign: UnsafeRawPointer?

    @inline(__always)
    static func swift<Value>(_ body: @escaping @Sendable (Value) -> Void) -> AdmittedCallback {
        AdmittedCallback(words: callbackWords(body), foreign: nil)
    }

    @inline(__always)
    static func foreign(
        _ callback: AnyObject, function: UnsafeRawPointer, userdata: UnsafeMutableRawPointer?
    ) -> AdmittedCallback {
        AdmittedCallback(
            words: (function, UnsafeRawPointer(userdata)),
            foreign: UnsafeRawPointer(Unmanaged.passRetained(callback).toOpaque()))
    }
}

/// The same two words, borrowed in a walk: noncopyable, so that calling through it borrows
/// the closure in place instead of retaining and releasing its context around the call (a
/// copyable view is copied out of the record first: measured, ~9 ns a callback).
struct BorrowedValueCallback<Value>: ~Copyable {
    let body: @Sendable (Value) -> Void
}

/// Calls one registered subscriber with `value`: its C function through the flow's
/// `ForeignCallback`, or its Swift closure in place. The caller checked just before that
/// the record is live (`FlowCore.live`, `forEachNewcomer`, `isOpen`).
///
/// `address`: where `value` is for the whole walk (`withValueAddress`), which a by-pointer C
/// callback gets — taken once per walk, not once per callback (in this unspecialized code a
/// `withUnsafePointer` per callback was a generic call and a copy of the value).
///
/// `usualInvoker`: the flow's (`FlowCore.usualInvoker`, read once per walk). A C subscriber
/// whose invoker it is (every one, unless the flow was given several kinds) is called without
/// reading its side record: at a million C subscribers the walk is memory-bound (see
/// `SubscriberEntry`).
@inline(__always)
func callSubscriber<Value>(
    _ walked: WalkedEntry, _ value: Value, at address: UnsafeRawPointer, usualInvoker: UnsafeRawPointer?
) {
    let entry = walked.entry
    if walked.tag & SubscriberEntry.foreignBit != 0 {
        let foreign = walked.tag & SubscriberEntry.usualInvokerBit != 0
            ? usualInvoker.unsafelyUnwrapped
            : walked.side.foreign.unsafelyUnwrapped
        let function = entry.word0.unsafelyUnwrapped
        let userdata = UnsafeMutableRawPointer(mutating: entry.word1)
        Unmanaged<ForeignCallback<Value>>.fromOpaque(foreign)._withUnsafeGuaranteedRef { invoker in
            if let pointerCall = invoker.pointerCall {
                pointerCall(address, function, userdata)
            } else {
                invoker.call(value, function, userdata)
            }
        }
    } else {
        invoke(
            (entry.raw + SubscriberEntry.callbackOffset).assumingMemoryBound(to: BorrowedValueCallback<Value>.self)
                .pointee, value)
    }
}

/// Runs `body` with the address of `value`, valid for the call (a walk's `callSubscriber` calls).
@inline(__always)
func withValueAddress<Value>(_ value: Value, _ body: (UnsafeRawPointer) -> Void) {
    withUnsafePointer(to: value) { body(UnsafeRawPointer($0)) }
}

@inline(__always)
private func invoke<Value>(_ callback: borrowing BorrowedValueCallback<Value>, _ value: Value) {
    callback.body(value)
}

