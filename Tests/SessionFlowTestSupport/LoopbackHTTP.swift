#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import Foundation

/// A tiny blocking HTTP/1.1 client for the tests' own calls to a test server on 127.0.0.1 (the
/// Authlib server's hooks, its password sign-in): POSIX sockets, one request per connection
/// (`Connection: close`), a Content-Length body, the answer read to EOF (chunked answers
/// decoded). Deliberately independent of the library's transport under test, and of URLSession.
package enum LoopbackHTTP {
    package struct Response: Sendable {
        package let status: Int
        /// In the order received; names as the server spelled them.
        package let headers: [(name: String, value: String)]
        package let body: [UInt8]

        /// The first header of that name (case-insensitive).
        package func header(_ name: String) -> String? {
            headers.first { $0.name.lowercased() == name.lowercased() }?.value
        }

        package var text: String { String(decoding: body, as: UTF8.self) }

        /// The body as a JSON value (JSONSerialization: Foundation, not its networking).
        package func json() throws -> Any {
            try JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed])
        }
    }

    package struct Failure: Error, CustomStringConvertible {
        package let description: String
        init(_ description: String) { self.description = description }
    }

    /// One request, blocking the calling thread until the answer has been read (or `timeout`
    /// passed without progress on the socket).
    package static func request(
        port: Int, method: String, path: String, headers: [(String, String)] = [], body: [UInt8] = [],
        timeout: Duration = .seconds(30)
    ) throws(Failure) -> Response {
        // SOCK_CLOEXEC: a process another test spawns meanwhile must not inherit the socket
        // (it would keep the connection open after this client closed it).
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw Failure("socket: \(errnoText())") }
        defer { close(fd) }
        let seconds = timeout.components.seconds
        var limit = timeval(tv_sec: Int(seconds), tv_usec: Int(timeout.components.attoseconds / 1_000_000_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr = in_addr(s_addr: UInt32(0x7F00_0001).bigEndian)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { throw Failure("connect to 127.0.0.1:\(port): \(errnoText())") }

        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n"
        if !body.isEmpty || method == "POST" || method == "PUT" { head += "Content-Length: \(body.count)\r\n" }
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        head += "\r\n"
        try writeAll(fd, Array(head.utf8) + body)

        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count > 0 {
                received += buffer[0..<count]
            } else if count == 0 {
                break
            } else if errno == EINTR {
                continue
            } else if errno == EAGAIN || errno == EWOULDBLOCK {
                throw Failure("no answer from 127.0.0.1:\(port)\(path) within \(timeout)")
            } else {
                throw Failure("read: \(errnoText())")
            }
        }
        return try parse(received)
    }

    /// `request` on a thread of its own (not the cooperative pool, which a blocking read must
    /// not hold: it has as many threads as cores, two here).
    package static func perform(
        port: Int, method: String, path: String, headers: [(String, String)] = [], body: [UInt8] = [],
        timeout: Duration = .seconds(30)
    ) async throws -> Response {
        try await withCheckedThrowingContinuation { continuation in
            let thread = Thread {
                continuation.resume(with: Result { () throws(Failure) -> Response in
                    try request(port: port, method: method, path: path, headers: headers, body: body, timeout: timeout)
                })
            }
            thread.name = "loopback-http"
            thread.start()
        }
    }

    /// `application/x-www-form-urlencoded`: unreserved characters kept, space as `+`, the rest %XX.
    package static func form(_ fields: [(String, String)]) -> [UInt8] {
        Array(fields.map { "\(formEscape($0.0))=\(formEscape($0.1))" }.joined(separator: "&").utf8)
    }

    static func formEscape(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "*"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: " "):
                out += "+"
            default:
                let digits = Array("0123456789ABCDEF".unicodeScalars)
                out.unicodeScalars.append("%")
                out.unicodeScalars.append(digits[Int(byte >> 4)])
                out.unicodeScalars.append(digits[Int(byte & 0xF)])
            }
        }
        return out
    }

    /// Status line, headers, and the body (Content-Length, chunked, or everything to EOF).
    static func parse(_ bytes: [UInt8]) throws(Failure) -> Response {
        let separator: [UInt8] = [13, 10, 13, 10]
        guard let end = bytes.indices.first(where: { bytes[$0...].starts(with: separator) }) else {
            throw Failure("the answer has no header end (\(bytes.count) bytes)")
        }
        let lines = String(decoding: bytes[..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let statusParts = lines[0].split(separator: " ", maxSplits: 2)
        guard statusParts.count >= 2, statusParts[0].hasPrefix("HTTP/1."), let status = Int(statusParts[1]) else {
            throw Failure("not an HTTP status line: \(lines[0].prefix(80))")
        }
        let headers = lines.dropFirst().compactMap { line -> (name: String, value: String)? in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        var body = Array(bytes[(end + 4)...])
        let response = Response(status: status, headers: headers, body: [])
        if response.header("Transfer-Encoding")?.lowercased().contains("chunked") == true {
            body = try dechunk(body)
        } else if let length = response.header("Content-Length").flatMap({ Int($0) }) {
            guard body.count >= length else { throw Failure("the answer ended after \(body.count) of \(length) bytes") }
            body = Array(body.prefix(length))
        }
        return Response(status: status, headers: headers, body: body)
    }

    static func dechunk(_ bytes: [UInt8]) throws(Failure) -> [UInt8] {
        var out: [UInt8] = []
        var index = 0
        while true {
            guard let lineEnd = bytes[index...].firstIndex(of: 13), lineEnd + 1 < bytes.count else {
                throw Failure("a cut chunked body")
            }
            let sizeText = String(decoding: bytes[index..<lineEnd], as: UTF8.self).split(separator: ";")[0]
            guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16) else {
                throw Failure("a bad chunk size")
            }
            index = lineEnd + 2
            if size == 0 { return out }
            guard index + size <= bytes.count else { throw Failure("a cut chunk") }
            out += bytes[index..<(index + size)]
            index += size + 2
        }
    }

    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) throws(Failure) {
        var offset = 0
        while offset < bytes.count {
            let count = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if count > 0 {
                offset += count
            } else if count < 0 && errno == EINTR {
                continue
            } else {
                throw Failure("write: \(errnoText())")
            }
        }
    }

    static func errnoText() -> String {
        String(cString: strerror(errno))
    }
}
