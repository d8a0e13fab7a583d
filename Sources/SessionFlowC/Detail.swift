import CSessionFlow
import Logging
import SessionCore
import SessionFlowErrors
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// MARK: - sf_last_error_message

/// Runs the body of the C function `function`. A negative code it returns becomes the
/// thread's `sf_last_error_message`: "function: " and what the body said with `explain`, or
/// the code's `sf_strerror` text when it said nothing. A call that succeeds leaves it as it was.
@inline(__always)
func api(_ function: StaticString, _ body: () -> Int32) -> Int32 {
    sf_detail_clear()
    let code = body()
    guard code < 0 else { return code }
    return sf_detail_finish(UnsafeRawPointer(function.utf8Start).assumingMemoryBound(to: CChar.self), code)
}

/// What is wrong, for the call running on this thread (the last said wins). Never a secret:
/// the library's own words, or an error's message (errors never carry tokens).
func explain(_ detail: String) {
    sf_detail_set(detail)
}

/// An argument `function` refuses with SF_EINVAL: said (sf_last_error_message) and logged,
/// to the log of the runtime behind `pointer` when there is one.
func refuse(_ function: String, _ pointer: OpaquePointer?, _ problem: String) {
    let logger = handle(of: pointer).flatMap { runtimes.lookup($0) }?.logger ?? makeLogger()
    logger.error("\(function): SF_EINVAL: \(problem)")
    explain(problem)  // after the log: a call the host's log function makes clears what was said
}

// MARK: - sf_options.log

/// The host's log function of one runtime. Lines are handed over one at a time (a lock), never
/// from inside the host's function (a line logged there is dropped: it would wait for itself),
/// and never after `close()` (the runtime's teardown).
final class LogSink: Sendable {
    private let function: @convention(c) (Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void
    private let userdata: UserData
    /// Open, and the thread inside the host's function (nil: none).
    private let state = Mutex<(open: Bool, writer: pthread_t?)>((true, nil))

    init(
        function: @escaping @convention(c) (Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void,
        userdata: UnsafeMutableRawPointer?
    ) {
        self.function = function
        self.userdata = UserData(pointer: userdata)
    }

    func write(_ level: Logger.Level, _ line: String) {
        let me = pthread_self()
        // Re-entry from the host's own function on this thread: dropped (the lock is ours).
        if state.withLock({ $0.writer.map { pthread_equal($0, me) != 0 } ?? false }) { return }
        // One line at a time; `close` waits for a line being written.
        writeLock.withLock { _ in
            guard state.withLock({ state -> Bool in
                guard state.open else { return false }
                state.writer = me
                return true
            }) else { return }
            line.withCString { function(Int32(bitPattern: level.cLevel.rawValue), $0, userdata.pointer) }
            state.withLock { $0.writer = nil }
        }
    }

    /// Whether this thread is inside the host's function (it called the library from there).
    var isWritingOnThisThread: Bool {
        let me = pthread_self()
        return state.withLock { $0.writer.map { pthread_equal($0, me) != 0 } ?? false }
    }

    /// After this returns, the host's function is never called again. Never from inside it.
    func close() {
        writeLock.withLock { _ in state.withLock { $0.open = false } }
    }

    private let writeLock = Mutex<Void>(())
}

extension Logger.Level {
    /// The sf_log_level of this level.
    var cLevel: sf_log_level {
        switch self {
        case .trace: SF_LOG_TRACE
        case .debug: SF_LOG_DEBUG
        case .info: SF_LOG_INFO
        case .notice: SF_LOG_NOTICE
        case .warning: SF_LOG_WARNING
        case .error: SF_LOG_ERROR
        case .critical: SF_LOG_CRITICAL
        }
    }

    /// The level of an sf_log_level value; nil for a value that is none.
    init?(cLevel: Int32) {
        switch UInt32(truncatingIfNeeded: cLevel) {
        case SF_LOG_TRACE.rawValue where cLevel >= 0: self = .trace
        case SF_LOG_DEBUG.rawValue: self = .debug
        case SF_LOG_INFO.rawValue: self = .info
        case SF_LOG_NOTICE.rawValue: self = .notice
        case SF_LOG_WARNING.rawValue: self = .warning
        case SF_LOG_ERROR.rawValue: self = .error
        case SF_LOG_CRITICAL.rawValue: self = .critical
        default: return nil
        }
    }
}

/// A swift-log handler that hands each line to a `LogSink`: "label: message key=value …";
/// without one (no `sf_options.log`), to standard error, "<time> <level> " before it. Either
/// way escaped: a host's string (a member id) cannot forge a line.
struct HostLogHandler: LogHandler {
    let label: String
    let sink: LogSink?
    var logLevel: Logger.Level
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let line = Self.line(event, label: label, metadata: metadata, provider: metadataProvider)
        guard let sink else { return Self.writeToStandardError(event.level, line) }
        sink.write(event.level, line)
    }

    /// "<time> <level> line\n" in one write(2) (a partial one finished), so that lines of
    /// several threads stay whole up to PIPE_BUF on a pipe.
    private static func writeToStandardError(_ level: Logger.Level, _ line: String) {
        var now = time(nil)
        var parts = tm()
        localtime_r(&now, &parts)
        var stamp = [CChar](repeating: 0, count: 40)
        let length = strftime(&stamp, stamp.count, "%Y-%m-%dT%H:%M:%S%z", &parts)
        let time = String(decoding: stamp.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        var bytes = Array("\(time) \(level) \(line)\n".utf8)[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) }
            if written < 0, errno == EINTR { continue }
            guard written > 0 else { return }
            bytes = bytes.dropFirst(written)
        }
    }

    /// "label: message key=value...", escaped.
    static func line(
        _ event: LogEvent, label: String, metadata: Logger.Metadata, provider: Logger.MetadataProvider?
    ) -> String {
        var all = metadata
        if let provided = provider?.get() { all.merge(provided) { _, new in new } }
        if let own = event.metadata { all.merge(own) { _, new in new } }
        var line = "\(label): \(event.message)"
        for (key, value) in all.sorted(by: { $0.key < $1.key }) {
            line += " \(key)=\(value)"
        }
        return escaped(line)
    }

    /// The line with every control character (C0, DEL, C1) and every format or bidi control
    /// (general category Cf: U+200E, U+202E, U+2066...) written as `\u{..}`, whatever put it
    /// there — a host's member id too: one call is one line, and nothing in it can forge
    /// another line, move the cursor or reorder what a terminal shows.
    static func escaped(_ line: String) -> String {
        guard line.unicodeScalars.contains(where: needsEscape) else { return line }
        var out = String.UnicodeScalarView()
        for scalar in line.unicodeScalars {
            if needsEscape(scalar) {
                out.append(contentsOf: "\\u{\(String(scalar.value, radix: 16))}".unicodeScalars)
            } else {
                out.append(scalar)
            }
        }
        return String(out)
    }

    private static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar.properties.generalCategory == .format
    }
}
