// Node.js as a peer: its EventEmitter on its own libuv loop, measured by Tools/node/
// eventemitter-bench.js with the parameters of our rows (sizes, updates, samples, pacing), run
// with `node` at the point of the run where our own row is measured, so that the floor of the
// same moment is beside it. No npm dependencies; when node is absent the rows say so.
//
// node: --node PATH, else $SESSIONFLOW_NODE, else `node` (or `nodejs`) on PATH.
// The script: --node-script PATH, else $SESSIONFLOW_NODE_SCRIPT, else node/eventemitter-bench.js
// in a directory above this executable (Tools/.build/<triple>/release → Tools), else
// Tools/node/eventemitter-bench.js under the current directory.
#if canImport(Glibc)
import Glibc
#endif

struct NodePeer {
    /// The node executable and the script, or why the Node rows have no figure.
    enum Availability {
        case available(node: String, script: String)
        case absent(String)
    }

    let availability: Availability

    /// What the rows say instead of a number (nil while Node gives figures).
    private(set) var failure: String?

    init(nodeOption: String?, scriptOption: String?, executableDirectory: String) {
        guard let node = nodeOption ?? environment("SESSIONFLOW_NODE") ?? searchPath(for: ["node", "nodejs"]) else {
            availability = .absent("node not installed")
            failure = "node not installed"
            return
        }
        guard access(node, X_OK) == 0 else {
            availability = .absent("node not found at \(node)")
            failure = "node not found"
            return
        }
        var candidates: [String] = []
        if let script = scriptOption ?? environment("SESSIONFLOW_NODE_SCRIPT") {
            candidates = [script]
        } else {
            var directory = executableDirectory
            for _ in 0..<5 {
                candidates.append(directory + "/node/eventemitter-bench.js")
                guard let slash = directory.lastIndex(of: "/"), slash != directory.startIndex else { break }
                directory = String(directory[..<slash])
            }
            candidates.append("Tools/node/eventemitter-bench.js")
        }
        guard let script = candidates.first(where: { access($0, R_OK) == 0 }) else {
            availability = .absent("eventemitter-bench.js not found (\(candidates.joined(separator: ", ")))")
            failure = "node script not found"
            return
        }
        availability = .available(node: node, script: script)
    }

    var isAvailable: Bool {
        if case .available = availability { return true }
        return false
    }

    /// Ns per callback of each measured emit, `subscribers` listeners after a probe.
    mutating func fanOut(_ subscribers: Int, updates: Int) -> [Double] {
        guard let answer = run(["fanout", "--sizes", "\(subscribers)", "--updates", "\(updates)"]),
              let entry = answer["fanout"]?.array?.first,
              let perUpdate = entry["per_update_ns"]?.array?.compactMap(\.number),
              perUpdate.count == updates
        else { return fail("fan-out") }
        return perUpdate
    }

    /// on + off pairs per second on the main thread, `background` other listeners live.
    mutating func churn(pairs: Int, background: Int) -> Double {
        guard let answer = run(["churn", "--pairs", "\(pairs)", "--background", "\(background)"]),
              let perSecond = answer["churn"]?["per_second"]?.number
        else { return fail("on/off churn") }
        return perSecond
    }

    /// Worker → main thread latencies in ns, one in flight, `warmup` samples discarded first.
    mutating func latencies(_ samples: Int, warmup: Int, paced: Bool) -> [UInt64] {
        guard let answer = run([
            "latency", "--samples", "\(samples)", "--warmup", "\(warmup)", "--paced", paced ? "1" : "0",
            "--pacing-ns", "\(pacing)",
        ]),
            let measured = answer["latency"]?["samples_ns"]?.array?.compactMap(\.number),
            measured.count == samples
        else { return fail("latency") }
        return measured.map { UInt64(max($0, 0)) }
    }

    private mutating func fail<T: RangeReplaceableCollection>(_ what: String) -> T {
        failure = failure ?? "node failed"
        note("Node.js \(what): no figure (see above)")
        return T()
    }

    private mutating func fail(_ what: String) -> Double {
        failure = failure ?? "node failed"
        note("Node.js \(what): no figure (see above)")
        return .nan
    }

    /// Runs the script with `arguments` and parses its stdout (nil with a note on any failure).
    private mutating func run(_ arguments: [String]) -> JSONValue? {
        guard case .available(let node, let script) = availability else { return nil }
        func quoted(_ text: String) -> String { "'" + text.split(separator: "'", omittingEmptySubsequences: false).joined(separator: "'\\''") + "'" }
        let command = ([node, script] + arguments).map(quoted).joined(separator: " ")
        guard let pipe = popen(command, "r") else {
            note("Node.js: cannot start \(command)")
            return nil
        }
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = fread(&buffer, 1, buffer.count, pipe)
            if count == 0 { break }
            output += buffer[0..<count]
        }
        let status = pclose(pipe)
        guard status == 0 else {
            note("Node.js: \(command) failed (status \(status))")
            return nil
        }
        guard let value = JSONValue.parse(output) else {
            note("Node.js: \(command) printed no JSON object: \(String(decoding: output.prefix(200), as: UTF8.self))")
            return nil
        }
        if let version = value["node"]?.string, version != self.version {
            self.version = version
            note("Node.js \(version) (\(node))")
        }
        return value
    }

    private(set) var version: String?
}

private func environment(_ name: String) -> String? {
    guard let value = getenv(name) else { return nil }
    let text = String(cString: value)
    return text.isEmpty ? nil : text
}

private func searchPath(for names: [String]) -> String? {
    let path = environment("PATH") ?? "/usr/local/bin:/usr/bin:/bin"
    for name in names {
        for directory in path.split(separator: ":") where !directory.isEmpty {
            let candidate = directory + "/" + name
            if access(candidate, X_OK) == 0 { return candidate }
        }
    }
    return nil
}

// MARK: a small JSON reader (no Foundation in the benchmark)

enum JSONValue {
    case null, bool(Bool), number(Double), string(String), array([JSONValue]), object([String: JSONValue])

    subscript(key: String) -> JSONValue? {
        if case .object(let fields) = self { return fields[key] }
        return nil
    }

    var array: [JSONValue]? {
        if case .array(let items) = self { return items }
        return nil
    }

    var number: Double? {
        if case .number(let value) = self { return value }
        return nil
    }

    var string: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    /// One JSON value filling `bytes` (surrounding white space allowed), or nil.
    static func parse(_ bytes: [UInt8]) -> JSONValue? {
        var reader = Reader(bytes: bytes)
        guard let value = reader.value() else { return nil }
        reader.skipSpace()
        return reader.index == bytes.count ? value : nil
    }

    private struct Reader {
        let bytes: [UInt8]
        var index = 0
        var depth = 0

        mutating func skipSpace() {
            while index < bytes.count, [0x20, 0x0A, 0x0D, 0x09].contains(bytes[index]) { index += 1 }
        }

        mutating func literal(_ text: String) -> Bool {
            let expected = Array(text.utf8)
            guard bytes.count - index >= expected.count, Array(bytes[index..<index + expected.count]) == expected
            else { return false }
            index += expected.count
            return true
        }

        mutating func value() -> JSONValue? {
            skipSpace()
            guard index < bytes.count, depth < 64 else { return nil }
            switch bytes[index] {
            case UInt8(ascii: "{"):
                index += 1
                depth += 1
                defer { depth -= 1 }
                var fields: [String: JSONValue] = [:]
                skipSpace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "}") { index += 1; return .object(fields) }
                while true {
                    skipSpace()
                    guard let key = string() else { return nil }
                    skipSpace()
                    guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { return nil }
                    index += 1
                    guard let item = value() else { return nil }
                    fields[key] = item
                    skipSpace()
                    guard index < bytes.count else { return nil }
                    index += 1
                    if bytes[index - 1] == UInt8(ascii: "}") { return .object(fields) }
                    guard bytes[index - 1] == UInt8(ascii: ",") else { return nil }
                }
            case UInt8(ascii: "["):
                index += 1
                depth += 1
                defer { depth -= 1 }
                var items: [JSONValue] = []
                skipSpace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "]") { index += 1; return .array(items) }
                while true {
                    guard let item = value() else { return nil }
                    items.append(item)
                    skipSpace()
                    guard index < bytes.count else { return nil }
                    index += 1
                    if bytes[index - 1] == UInt8(ascii: "]") { return .array(items) }
                    guard bytes[index - 1] == UInt8(ascii: ",") else { return nil }
                }
            case UInt8(ascii: "\""):
                return string().map(JSONValue.string)
            case UInt8(ascii: "t"): return literal("true") ? .bool(true) : nil
            case UInt8(ascii: "f"): return literal("false") ? .bool(false) : nil
            case UInt8(ascii: "n"): return literal("null") ? .null : nil
            default:
                let start = index
                while index < bytes.count, "+-0123456789.eE".utf8.contains(bytes[index]) { index += 1 }
                guard index > start, let number = Double(String(decoding: bytes[start..<index], as: UTF8.self))
                else { return nil }
                return .number(number)
            }
        }

        /// A string; escapes other than \uXXXX kept simple (\" \\ \/ \b \f \n \r \t).
        mutating func string() -> String? {
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { return nil }
            index += 1
            var text: [UInt8] = []
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    return String(decoding: text, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard index < bytes.count else { return nil }
                    let escape = bytes[index]
                    index += 1
                    switch escape {
                    case UInt8(ascii: "n"): text.append(0x0A)
                    case UInt8(ascii: "r"): text.append(0x0D)
                    case UInt8(ascii: "t"): text.append(0x09)
                    case UInt8(ascii: "b"): text.append(0x08)
                    case UInt8(ascii: "f"): text.append(0x0C)
                    case UInt8(ascii: "u"):
                        guard bytes.count - index >= 4,
                              let code = UInt32(String(decoding: bytes[index..<index + 4], as: UTF8.self), radix: 16)
                        else { return nil }
                        index += 4
                        // Surrogates (never in the script's output) become U+FFFD.
                        text += Array(String(Character(Unicode.Scalar(code) ?? "\u{FFFD}")).utf8)
                    default: text.append(escape)
                    }
                default:
                    text.append(byte)
                }
            }
            return nil
        }
    }
}
