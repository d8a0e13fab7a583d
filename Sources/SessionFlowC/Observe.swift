import CSessionFlow
import LoopFlow
import SessionCore

/// Open subscriptions by handle (the subscription's own process-unique id). An entry goes
/// when the host closes it or when its `release` runs, whichever comes first.
let subscriptions = HandleTable<FlowSubscription>(.subscription)

extension SessionState {
    var c: sf_session_state {
        switch self {
        case .loggedOut: SF_LOGGED_OUT
        case .loggedIn: SF_LOGGED_IN
        case .sessionExpired: SF_SESSION_EXPIRED
        }
    }
}

extension StoreStatus {
    var c: sf_store_status {
        switch self {
        case .reading: SF_STORE_READING
        case .available: SF_STORE_AVAILABLE
        case .unavailable: SF_STORE_UNAVAILABLE
        }
    }

    /// Why the store is unavailable ("" otherwise): a store error's message (paths and
    /// causes, never a token).
    var reason: String {
        if case .unavailable(let error) = self { return error.message }
        return ""
    }
}

/// How the flows call a C observer's value callback: one for each kind of callback, shared
/// by every C subscriber (the subscriber's record holds its function and userdata).
private typealias StateFunction = @convention(c) (sf_session_state, UnsafeMutableRawPointer?) -> Void
private typealias StatusFunction = @convention(c) (sf_store_status, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void
private typealias EventFunction = @convention(c) (UnsafePointer<sf_event>?, UnsafeMutableRawPointer?) -> Void

// By pointer: the walk hands over the state's address, no thunk (the C one-subscriber fan-out).
private let stateCallback = ForeignCallback<SessionState>.byPointer { state, function, userdata in
    unsafeBitCast(function, to: StateFunction.self)(state.assumingMemoryBound(to: SessionState.self).pointee.c, userdata)
}

private let statusCallback = ForeignCallback<StoreStatus> { status, function, userdata in
    status.reason.withCString { unsafeBitCast(function, to: StatusFunction.self)(status.c, $0, userdata) }
}

private let eventCallback = ForeignCallback<SessionEvent> { event, function, userdata in
    withCEvent(event) { unsafeBitCast(function, to: EventFunction.self)($0, userdata) }
}

/// A C observer's value function, as the raw pointer a foreign subscriber takes (nil: the
/// observer has none, and gets a subscription without value callbacks).
private func rawFunction<F>(_ function: F?) -> UnsafeRawPointer? {
    function.map { unsafeBitCast($0, to: UnsafeRawPointer.self) }
}

/// The terminal and release callbacks every observer has, as the closures a flow takes.
struct TerminalCallbacks: @unchecked Sendable {
    let onError: (@convention(c) (Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void)?
    let onComplete: (@convention(c) (UnsafeMutableRawPointer?) -> Void)?
    let release: (@convention(c) (UnsafeMutableRawPointer?) -> Void)?
    let userdata: UnsafeMutableRawPointer?

    var errorClosure: @Sendable (any Error) -> Void {
        { error in
            let code = (error as? SessionError).map(errorCode) ?? SF_EINVAL.code
            "\(error)".withCString { onError?(code, $0, userdata) }
        }
    }

    var completeClosure: @Sendable () -> Void {
        { onComplete?(userdata) }
    }

    /// Runs `removeHandle` first, then the host's release.
    func releaseClosure(_ removeHandle: @escaping @Sendable () -> Void) -> @Sendable () -> Void {
        { removeHandle(); release?(userdata) }
    }
}

@c @implementation
public func sf_session_state_get(_ pointer: OpaquePointer!, _ out: UnsafeMutablePointer<sf_session_state>!) -> Int32 {
    api("sf_session_state_get") {
        guard let out else { return SF_EINVAL.code }
        return withRuntime(pointer) { runtime in
            out.pointee = runtime.session.state.value.c
            return SF_OK.code
        }
    }
}

@c @implementation
public func sf_session_store_status(
    _ pointer: OpaquePointer!, _ out: UnsafeMutablePointer<sf_store_status>!,
    _ reason: UnsafeMutablePointer<CChar>!, _ length: Int
) -> Int32 {
    api("sf_session_store_status") {
        guard let out else { return SF_EINVAL.code }
        return withRuntime(pointer) { runtime in
            let status = runtime.session.storeStatus.value
            if let reason {
                let text = Array(status.reason.utf8)
                guard length > text.count else { return SF_ERANGE.code }
                for (index, byte) in text.enumerated() {
                    reason[index] = CChar(bitPattern: byte)
                }
                reason[text.count] = 0
            }
            out.pointee = status.c
            return SF_OK.code
        }
    }
}

@c @implementation
public func sf_subscribe_store_status(
    _ pointer: OpaquePointer!, _ observer: UnsafePointer<sf_store_observer>!,
    _ out: UnsafeMutablePointer<sf_subscription>!
) -> Int32 {
    api("sf_subscribe_store_status") {
        subscribe("sf_subscribe_store_status", pointer, observer, out, statusCallback) { $0.session.storeStatus }
    }
}

/// A C observer struct: its size, its value callback (`on_state`, `on_status`, `on_event`)
/// and the terminal and release callbacks every observer has. (The members are read in each
/// conformance: an imported C function pointer member does not witness a protocol property.)
protocol CObserver {
    static var name: String { get }
    var size: Int { get }
    var valueFunction: UnsafeRawPointer? { get }
    var terminal: TerminalCallbacks { get }
}

extension sf_observer: CObserver {
    static var name: String { "sf_observer" }
    var valueFunction: UnsafeRawPointer? { rawFunction(on_state) }
    var terminal: TerminalCallbacks { TerminalCallbacks(onError: on_error, onComplete: on_complete, release: release, userdata: userdata) }
}

extension sf_store_observer: CObserver {
    static var name: String { "sf_store_observer" }
    var valueFunction: UnsafeRawPointer? { rawFunction(on_status) }
    var terminal: TerminalCallbacks { TerminalCallbacks(onError: on_error, onComplete: on_complete, release: release, userdata: userdata) }
}

extension sf_event_observer: CObserver {
    static var name: String { "sf_event_observer" }
    var valueFunction: UnsafeRawPointer? { rawFunction(on_event) }
    var terminal: TerminalCallbacks { TerminalCallbacks(onError: on_error, onComplete: on_complete, release: release, userdata: userdata) }
}

/// A flow a C observer can subscribe to: with its value function, or (an observer without
/// one) with the terminal and release callbacks only. StateFlow and SharedFlow differ in the
/// label of their Swift value closure only.
protocol CObservable<Value> {
    associatedtype Value
    func subscribe(
        foreign callback: ForeignCallback<Value>, function: UnsafeRawPointer, userdata: UnsafeMutableRawPointer?,
        onError: (@Sendable (any Error) -> Void)?, onComplete: (@Sendable () -> Void)?, onRelease: (@Sendable () -> Void)?
    ) throws(LoopFlowError) -> FlowSubscription
    func subscribeWithoutValues(
        onError: @escaping @Sendable (any Error) -> Void, onComplete: @escaping @Sendable () -> Void,
        onRelease: @escaping @Sendable () -> Void
    ) throws(LoopFlowError) -> FlowSubscription
}

extension StateFlow: CObservable {
    func subscribeWithoutValues(
        onError: @escaping @Sendable (any Error) -> Void, onComplete: @escaping @Sendable () -> Void,
        onRelease: @escaping @Sendable () -> Void
    ) throws(LoopFlowError) -> FlowSubscription {
        try subscribe(onState: { _ in }, onError: onError, onComplete: onComplete, onRelease: onRelease)
    }
}

extension SharedFlow: CObservable {
    func subscribeWithoutValues(
        onError: @escaping @Sendable (any Error) -> Void, onComplete: @escaping @Sendable () -> Void,
        onRelease: @escaping @Sendable () -> Void
    ) throws(LoopFlowError) -> FlowSubscription {
        try subscribe(onEvent: { _ in }, onError: onError, onComplete: onComplete, onRelease: onRelease)
    }
}

/// The one body of sf_subscribe_session_state, sf_subscribe_store_status and
/// sf_subscribe_events: checks the observer (nothing is called and nothing kept when it is
/// refused), subscribes it to the runtime's `flow` and publishes the handle.
private func subscribe<Observer: CObserver, Flow: CObservable>(
    _ name: String, _ pointer: OpaquePointer?, _ observer: UnsafePointer<Observer>?,
    _ out: UnsafeMutablePointer<sf_subscription>?, _ callback: ForeignCallback<Flow.Value>,
    _ flow: @escaping (Runtime) -> Flow
) -> Int32 {
    guard let observer, let out else { return SF_EINVAL.code }
    let function = observer.pointee.valueFunction
    let terminal = observer.pointee.terminal
    let userdata = terminal.userdata
    guard usableObserver(
        name, pointer, Observer.name, size: observer.pointee.size, expected: MemoryLayout<Observer>.size,
        callbacks: [function, rawFunction(terminal.onError), rawFunction(terminal.onComplete), rawFunction(terminal.release)])
    else { return SF_EINVAL.code }
    return withRuntime(pointer) { runtime in
        register(out) { onRelease throws(LoopFlowError) in
            let flow = flow(runtime)
            guard let function else {
                return try flow.subscribeWithoutValues(
                    onError: terminal.errorClosure, onComplete: terminal.completeClosure,
                    onRelease: terminal.releaseClosure(onRelease))
            }
            return try flow.subscribe(
                foreign: callback, function: function, userdata: userdata,
                onError: terminal.errorClosure, onComplete: terminal.completeClosure,
                onRelease: terminal.releaseClosure(onRelease))
        }
    }
}

/// Subscribes through `subscribe` and publishes the handle (a tagged handle of the
/// process-wide counter, mapped to the subscription). The table entry goes when `release`
/// runs — which, at a teardown racing this call, can be before the entry is made; the
/// shared record settles who removes it.
private func register(
    _ out: UnsafeMutablePointer<sf_subscription>,
    _ subscribe: (_ onRelease: @escaping @Sendable () -> Void) throws(LoopFlowError) -> FlowSubscription
) -> Int32 {
    let record = LockedBox<(id: UInt64, released: Bool)>((0, false))
    let subscription: FlowSubscription
    do {
        subscription = try subscribe {
            let id = record.withLockedValue { record in
                record.released = true
                return record.id
            }
            if id != 0 { _ = subscriptions.remove(id) }
        }
    } catch {
        return SF_ESHUTDOWN.code
    }
    let handle = subscriptions.insert(subscription)
    let releasedAlready = record.withLockedValue { record in
        record.id = handle
        return record.released
    }
    if releasedAlready { _ = subscriptions.remove(handle) }
    out.pointee = handle
    return SF_OK.code
}

/// Whether an observer the host passed is usable: its `size` that of the released layout
/// (the observers gained `size` in 0.x; one layout since), and at least one callback set —
/// a subscription that can call nothing, release nothing, would only leak. Logs why not.
private func usableObserver(
    _ name: String, _ pointer: OpaquePointer?, _ structName: String, size: Int, expected: Int,
    callbacks: [UnsafeRawPointer?]
) -> Bool {
    guard acceptedSize(size, [expected]) else {
        refuse(name, pointer, "\(structName).size is \(size), not \(expected) (set it to sizeof(\(structName)))")
        return false
    }
    guard callbacks.contains(where: { $0 != nil }) else {
        refuse(name, pointer, "\(structName) has no callback at all (the subscription could only leak)")
        return false
    }
    return true
}

@c @implementation
public func sf_subscribe_session_state(
    _ pointer: OpaquePointer!, _ observer: UnsafePointer<sf_observer>!, _ out: UnsafeMutablePointer<sf_subscription>!
) -> Int32 {
    api("sf_subscribe_session_state") {
        subscribe("sf_subscribe_session_state", pointer, observer, out, stateCallback) { $0.session.state }
    }
}

@c @implementation
public func sf_subscribe_events(
    _ pointer: OpaquePointer!, _ observer: UnsafePointer<sf_event_observer>!,
    _ out: UnsafeMutablePointer<sf_subscription>!
) -> Int32 {
    api("sf_subscribe_events") {
        subscribe("sf_subscribe_events", pointer, observer, out, eventCallback) { $0.session.events }
    }
}

@c @implementation
public func sf_subscription_close(_ subscription: sf_subscription) -> Int32 {
    api("sf_subscription_close") {
        // A handle of another kind (a runtime's, a sign-in's) finds nothing, like an unknown one.
        guard subscription != 0, let open = subscriptions.remove(subscription) else { return SF_ECLOSED.code }
        return open.close() ? SF_OK.code : SF_ECLOSED.code
    }
}

/// Calls `body` with the C form of `event`; its strings live for the call only.
func withCEvent(_ event: SessionEvent, _ body: (UnsafePointer<sf_event>) -> Void) {
    var c = sf_event()
    c.size = MemoryLayout<sf_event>.size
    c.retry_in_ms = -1
    c.expires_in_ms = -1
    var memberID: String?
    var reason: String?
    switch event {
    case .initialSession(let state):
        c.kind = SF_EVENT_INITIAL_SESSION
        c.state = state.c
    case .signedIn(let member):
        c.kind = SF_EVENT_SIGNED_IN
        memberID = member
    case .signedOut(let why):
        c.kind = SF_EVENT_SIGNED_OUT
        reason = why.rawValue
    case .tokenRefreshed(let expiresIn, let why):
        c.kind = SF_EVENT_TOKEN_REFRESHED
        c.expires_in_ms = milliseconds(expiresIn)
        reason = why.rawValue
    case .refreshFailed(let attempt, let retryIn, let error):
        c.kind = SF_EVENT_REFRESH_FAILED
        c.attempt = Int32(clamping: attempt)
        c.retry_in_ms = retryIn.map(milliseconds) ?? -1
        c.code = code(of: error)
        reason = error.description
    case .sessionExpired(let why):
        c.kind = SF_EVENT_SESSION_EXPIRED
        reason = why
    case .validated:
        c.kind = SF_EVENT_VALIDATED
    case .storeError(let error):
        c.kind = SF_EVENT_STORE_ERROR
        c.code = SF_ESTORE.code
        reason = error.message
    case .accountSwitched(let account):
        c.kind = SF_EVENT_ACCOUNT_SWITCHED
        memberID = account
    }
    withOptionalCString(memberID) { memberPointer in
        withOptionalCString(reason) { reasonPointer in
            c.member_id = memberPointer
            c.reason = reasonPointer
            withUnsafePointer(to: c) { body($0) }
        }
    }
}

func withOptionalCString<T>(_ text: String?, _ body: (UnsafePointer<CChar>?) -> T) -> T {
    guard let text else { return body(nil) }
    return text.withCString { body($0) }
}

/// Whole milliseconds, saturating at Int64's range (never a trap for a C host).
func milliseconds(_ duration: Duration) -> Int64 {
    let (seconds, attoseconds) = duration.components
    let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1000)
    if overflow { return seconds < 0 ? Int64.min : Int64.max }
    let (total, overflowAgain) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
    if overflowAgain { return seconds < 0 ? Int64.min : Int64.max }
    return total
}

func code(of error: AuthorityError) -> Int32 {
    switch error.kind {
    case .terminal: SF_EAUTH.code
    case .transient: SF_ENETWORK.code
    case .configuration: SF_ECONFIG.code
    }
}
