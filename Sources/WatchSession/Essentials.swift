// What watch-session took from Foundation beyond FoundationEssentials, in a few small helpers:
// Foundation proper brings ICU (about 40 MB of the static binary) for date formatting,
// JSONSerialization and FileHandle, which a CLI can do with Glibc. FoundationEssentials (URL,
// Data, FileManager, ProcessInfo, UUID) has no ICU.
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// Standard output or error: bytes written with write(2) until all are out.
struct StandardStream: Sendable {
    static let output = StandardStream(descriptor: STDOUT_FILENO)
    static let error = StandardStream(descriptor: STDERR_FILENO)

    let descriptor: Int32

    /// Writes every byte. Nil when all went out; else why not (an errno: a closed descriptor,
    /// a full disk, a closed pipe with SIGPIPE ignored), the rest unwritten.
    @discardableResult
    func write(_ bytes: some Sequence<UInt8>) -> Int32? {
        let all = Array(bytes)
        var written = 0
        while written < all.count {
            let count = all[written...].withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return count == 0 ? EIO : errno }  // 0: nothing taken, no reason given
            written += count
        }
        return nil
    }

    /// Makes sure descriptors 0, 1 and 2 are open, before anything else opens one: a process
    /// started with one of them closed would otherwise hand that number to the next descriptor
    /// it opens (libdispatch's epoll, a store file, a socket), and what is meant for standard
    /// output — a token — would go there. A closed one gets /dev/null, opened read-only: a read
    /// of standard input finds its end, and a write to standard output or error still fails
    /// (`EBADF`, as on the closed descriptor), so `token` says it could not print. Exits (71)
    /// when a hole cannot be filled.
    static func openStandardDescriptors() {
        for descriptor in STDIN_FILENO...STDERR_FILENO where fcntl(descriptor, F_GETFD) == -1 && errno == EBADF {
            // The lowest free number: this one, the lower ones being open already.
            let opened = open("/dev/null", O_RDONLY)
            if opened == descriptor { continue }
            if opened >= 0, dup2(opened, descriptor) == descriptor {
                close(opened)
                continue
            }
            let message = "watch-session: standard descriptor \(descriptor) is closed and /dev/null cannot be opened onto it\n"
            _ = message.withCString { Glibc.write(STDERR_FILENO, $0, strlen($0)) }
            exit(StatusCodes.internalFailure)
        }
    }

    /// Everything on standard input, to its end.
    static func readInput() -> Data {
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(STDIN_FILENO, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return data }
            data.append(contentsOf: buffer[..<count])
        }
    }
}

/// A lock over `pthread_mutex_t` (DESIGN.md: not `Synchronization.Mutex`, which TSan cannot see).
final class Lock: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)

    init() { pthread_mutex_init(mutex, nil) }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }
}

/// Runs `body` on a detached thread of its own (a blocking read, a child to wait for).
func detachThread(_ body: @escaping @Sendable () -> Void) {
    final class Box { let body: @Sendable () -> Void; init(_ body: @escaping @Sendable () -> Void) { self.body = body } }
    let box = Unmanaged.passRetained(Box(body)).toOpaque()
    var thread = pthread_t()
    let started = pthread_create(&thread, nil, { pointer in
        let box = Unmanaged<AnyObject>.fromOpaque(pointer!).takeRetainedValue() as! Box
        box.body()
        return nil
    }, box)
    if started == 0 {
        pthread_detach(thread)
    } else {
        Unmanaged<AnyObject>.fromOpaque(box).release()
    }
}

/// Times as watch-session prints them.
enum Clock {
    /// Local time of day, `HH:mm:ss.SSS`.
    static func timeOfDay() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var parts = tm()
        var seconds = now.tv_sec
        localtime_r(&seconds, &parts)
        return pad(Int(parts.tm_hour), 2) + ":" + pad(Int(parts.tm_min), 2) + ":" + pad(Int(parts.tm_sec), 2) + "."
            + pad(Int(now.tv_nsec / 1_000_000), 3)
    }

    /// Now in UTC as ISO 8601, `yyyy-MM-ddTHH:mm:ssZ` (ISO8601DateFormatter's default form).
    static func iso8601() -> String {
        var seconds = time(nil)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return pad(Int(parts.tm_year) + 1900, 4) + "-" + pad(Int(parts.tm_mon) + 1, 2) + "-" + pad(Int(parts.tm_mday), 2)
            + "T" + pad(Int(parts.tm_hour), 2) + ":" + pad(Int(parts.tm_min), 2) + ":" + pad(Int(parts.tm_sec), 2) + "Z"
    }

    /// `value` in decimal with at least `width` digits (zeros in front).
    static func pad(_ value: Int, _ width: Int) -> String {
        let digits = String(value)
        return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
    }

    /// `value` with `decimals` digits after the point, rounded.
    static func fixed(_ value: Double, _ decimals: Int) -> String {
        var scale = 1.0
        for _ in 0..<decimals { scale *= 10 }
        let scaled = Int64((value * scale).rounded())
        guard decimals > 0 else { return String(scaled) }
        let whole = scaled / Int64(scale)
        let fraction = abs(scaled % Int64(scale))
        return (scaled < 0 && whole == 0 ? "-" : "") + String(whole) + "." + pad(Int(fraction), decimals)
    }
}

/// JSON null in the objects watch-session prints (JSONSerialization's NSNull).
struct JSONNull {}

/// The JSON text of `value` (a `[String: Any]`, an array, a string, a number, a Bool or
/// `JSONNull`), keys sorted, compact, `/` escaped: what JSONSerialization with `.sortedKeys` wrote.
enum JSONText {
    static func of(_ value: Any) -> String {
        var out = ""
        write(value, into: &out)
        return out
    }

    private static func write(_ value: Any, into out: inout String) {
        switch value {
        case is JSONNull:
            out += "null"
        case let text as String:
            string(text, into: &out)
        case let flag as Bool:
            out += flag ? "true" : "false"
        case let number as Int:
            out += String(number)
        case let number as Int64:
            out += String(number)
        case let number as Int32:
            out += String(number)
        case let number as UInt64:
            out += String(number)
        case let number as Double:
            out += number.isFinite ? (number == number.rounded() && abs(number) < 1e15 ? String(Int64(number)) : "\(number)") : "null"
        case let object as [String: Any]:
            out += "{"
            for (index, key) in object.keys.sorted().enumerated() {
                if index > 0 { out += "," }
                string(key, into: &out)
                out += ":"
                write(object[key]!, into: &out)
            }
            out += "}"
        case let array as [Any]:
            out += "["
            for (index, element) in array.enumerated() {
                if index > 0 { out += "," }
                write(element, into: &out)
            }
            out += "]"
        default:
            // An Optional in an `Any`: its value, or null. Anything else: its description.
            let mirror = Mirror(reflecting: value)
            if mirror.displayStyle == .optional {
                if let wrapped = mirror.children.first?.value { write(wrapped, into: &out) } else { out += "null" }
            } else {
                string("\(value)", into: &out)
            }
        }
    }

    private static func string(_ text: String, into out: inout String) {
        out += "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "/": out += "\\/"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{8}": out += "\\b"
            case "\u{C}": out += "\\f"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "\""
    }
}
