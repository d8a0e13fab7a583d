/// Errors of the LoopFlow layer.
///
/// A struct with an extensible `Code` rather than a frozen enum, so new codes can be
/// added without breaking anyone's `switch` (swift-service-lifecycle's shape).
/// A call that throws one of these has invoked none of its callbacks and taken no
/// ownership of anything it was given (contract rule 6).
public struct LoopFlowError: Error, Hashable, CustomStringConvertible, Sendable {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: Hashable, Sendable {
            case loopShutDown, busy, wrongThread, invalidConfiguration, alreadyShutDown, libuv, overloaded
        }
        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// The loop has been shut down (or is shutting down): nothing new is accepted.
        public static let loopShutDown = Code(.loopShutDown)
        /// The call would deadlock where it was made (e.g. shutting an owned loop down from its own thread).
        public static let busy = Code(.busy)
        /// A loop-thread-only call was made from another thread.
        public static let wrongThread = Code(.wrongThread)
        /// A flow or loop was configured with values that cannot work.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// `shutdown()` was already called on this loop.
        public static let alreadyShutDown = Code(.alreadyShutDown)
        /// libuv reported an error (the message carries `uv_strerror`).
        public static let libuv = Code(.libuv)
        /// The loop's limit of waiting requests is reached (`EventLoop.executeBounded`):
        /// nothing was queued. The loop is stuck in a callback or far behind; retry later.
        public static let overloaded = Code(.overloaded)

        public var description: String {
            switch base {
            case .loopShutDown: "loopShutDown"
            case .busy: "busy"
            case .wrongThread: "wrongThread"
            case .invalidConfiguration: "invalidConfiguration"
            case .alreadyShutDown: "alreadyShutDown"
            case .libuv: "libuv"
            case .overloaded: "overloaded"
            }
        }
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "LoopFlowError.\(code): \(message)" }
}
