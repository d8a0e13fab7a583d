// libFuzzer target for what the loopback listener of a browser sign-in reads from any local
// process (issue 29, point 8): the request line (`ll_parse_request_line` in loop_listener.c,
// through `LoopbackRequestParsing.requestLine`), then, for a line it takes, the callback's
// query (`LoopbackRequestParsing.callback`) and the page text made from it (`shown`).
//
// Build and run (see Fuzz/README.md and scripts/fuzz.sh):
//   swift build --package-path Tools --product fuzz-loopback-request --sanitize=fuzzer --sanitize=address \
//       -Xswiftc -sanitize=fuzzer,address --scratch-path .build-fuzz
//   .build-fuzz/debug/fuzz-loopback-request CORPUS_COPY
//
// One file, not named main.swift, and no top-level code but one global (see
// FuzzTokenResponse.swift for why).
//
// Input: the bytes a connection sent, as they are (the head, up to the listener's 8 KiB).
//
// Properties, each a trap with its own message:
//   - a request line is taken only when the input begins "METHOD TARGET HTTP/1.x\r\n" with
//     METHOD 1 to 16 of A-Z and TARGET starting with '/' made of %x21-7E only;
//   - the query's fields decode to valid UTF-8 (String) without a trap;
//   - what a page shows of a field is printable ASCII, at most 200 characters before HTML
//     escaping, with no raw '<', '>', '"' or '\''.

@_spi(Fuzzing) import SessionOAuth
import FuzzReplay

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzLoopbackRequest(_ start: UnsafeRawPointer?, _ count: Int) -> CInt {
    let head = Array(UnsafeRawBufferPointer(start: start, count: min(count, 8192)))
    guard let (method, target) = LoopbackRequestParsing.requestLine(head) else { return 0 }
    let methodBytes = Array(method.utf8), targetBytes = Array(target.utf8)
    guard (1...16).contains(methodBytes.count), methodBytes.allSatisfy({ (0x41...0x5A).contains($0) }) else {
        fatalError("property violated: a method outside [A-Z]{1,16} was taken")
    }
    guard targetBytes.first == UInt8(ascii: "/"), targetBytes.allSatisfy({ (0x21...0x7E).contains($0) }) else {
        fatalError("property violated: a target that is not '/' + %x21-7E was taken")
    }
    let line11 = Array("\(method) \(target) HTTP/1.1\r\n".utf8), line10 = Array("\(method) \(target) HTTP/1.0\r\n".utf8)
    guard head.starts(with: line11) || head.starts(with: line10) else {
        fatalError("property violated: the request line taken is not what the input begins with")
    }
    let (_, fields) = LoopbackRequestParsing.callback(target)
    for (name, value) in fields ?? [] {
        for text in [name, value] {
            let shown = LoopbackRequestParsing.shown(text, limit: 200)
            guard shown.unicodeScalars.allSatisfy({ (0x20...0x7E).contains($0.value) }),
                  !shown.contains(where: { "<>\"'".contains($0) })
            else {
                fatalError("property violated: page text with a raw markup or non-printable character")
            }
        }
    }
    return 0
}

// A plain build: the entry point runs this global's initializer, which replays the inputs named
// on the command line (Tools/Sources/FuzzReplay). The fuzzer's build (-parse-as-library) has no
// top-level code: this is a lazy global nobody reads, so it never runs there.
let replayed: Never = replay(fuzzLoopbackRequest)
