// Standard library only: SessionOAuth is leaving Foundation (issue 13).
import SessionCore

/// One secret as the forms it may take in a text: for each of its Unicode scalars, the byte
/// patterns that stand for it. Matching runs the alternatives as a set of positions (an NFA),
/// so mixed forms and ambiguous prefixes (`%` itself, `\` itself) cost no backtracking. Kept
/// flat (three arrays per secret) and matched with reused scratch space: an error path may
/// run it on every answer, and a fuzzer millions of times.
///
/// `match(_:at:cutTailMatches:_:)` costs up to the secret's length at a start; trying it at
/// every start of a text full of near misses (a 4 KiB description of `a`s against a
/// 1 000-character token ending in `b`) was quadratic: seconds under ThreadSanitizer. So the
/// scans (`ErrorText.replace`, `firstMatch`) first find the starts where a match exists with
/// one backward pass over the text (`matchStarts`, SecretPattern+Starts.swift: linear in the
/// text, times the secret's length / 64), and run `match` only there.
struct SecretPattern {
    /// One byte of a form: that exact byte, or a hexadecimal digit of that value in either case.
    enum Unit: Equatable {
        case byte(UInt8)
        case hex(UInt8)

        func matches(_ b: UInt8) -> Bool {
            switch self {
            case .byte(let value): return b == value
            case .hex(let value):
                if value < 10 { return b == 0x30 + value }
                return b == 0x41 + value - 10 || b == 0x61 + value - 10
            }
        }
    }

    /// Every form's units, one form after another.
    let units: [Unit]
    /// Form `f` is `units[formStarts[f]..<formStarts[f + 1]]`.
    let formStarts: [Int]
    /// The forms of scalar `s` are `scalarStarts[s]..<scalarStarts[s + 1]`.
    let scalarStarts: [Int]
    /// For scalar `s`, the bytes its forms begin with (a quick rejection inside a match).
    private let scalarFirstBytes: [(UInt64, UInt64, UInt64, UInt64)]
    /// Bytes that can begin a match (a quick rejection): a 256-bit set.
    let firstBytes: (UInt64, UInt64, UInt64, UInt64)
    /// The secret's length in scalars (`m`).
    let scalarCount: Int
    /// Words of a bit set over the scalar indices 0...m (`matchStarts`).
    let maskWords: Int
    /// Each distinct scalar of the secret: its row in `masks`, and a scalar index where it
    /// stands (its forms).
    let distinctScalars: [Unicode.Scalar: (row: Int, index: Int)]
    /// Row r (`maskWords` words): bit j set when the secret's scalar j is row r's scalar.
    let masks: [UInt64]

    init?(_ secret: Secret) {
        let text = secret.reveal()
        guard !text.isEmpty else { return nil }
        var units: [Unit] = []
        var formStarts: [Int] = [0]
        var scalarStarts: [Int] = [0]
        let scalars = Array(text.unicodeScalars)
        for scalar in scalars {
            Self.appendForms(of: scalar, to: &units, &formStarts)
            scalarStarts.append(formStarts.count - 1)
        }
        let words = (scalars.count + 1 + 63) / 64
        var distinct: [Unicode.Scalar: (row: Int, index: Int)] = [:]
        for (index, scalar) in scalars.enumerated() where distinct[scalar] == nil {
            distinct[scalar] = (distinct.count, index)
        }
        var masks = [UInt64](repeating: 0, count: distinct.count * words)
        for (index, scalar) in scalars.enumerated() {
            masks[distinct[scalar]!.row * words + index / 64] |= UInt64(1) << UInt64(index % 64)
        }
        self.scalarCount = scalars.count
        self.maskWords = words
        self.distinctScalars = distinct
        self.masks = masks
        var scalarFirstBytes: [(UInt64, UInt64, UInt64, UInt64)] = []
        scalarFirstBytes.reserveCapacity(scalarStarts.count - 1)
        for scalar in 0..<(scalarStarts.count - 1) {
            var first: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
            for form in scalarStarts[scalar]..<scalarStarts[scalar + 1] {
                guard case .byte(let b) = units[formStarts[form]] else {
                    preconditionFailure("a form begins with a hexadecimal digit")
                }
                let bit = UInt64(1) << UInt64(b & 63)
                switch b >> 6 {
                case 0: first.0 |= bit
                case 1: first.1 |= bit
                case 2: first.2 |= bit
                default: first.3 |= bit
                }
            }
            scalarFirstBytes.append(first)
        }
        self.units = units
        self.formStarts = formStarts
        self.scalarStarts = scalarStarts
        self.scalarFirstBytes = scalarFirstBytes
        self.firstBytes = scalarFirstBytes[0]
    }

    func canBegin(_ byte: UInt8) -> Bool {
        Self.contains(firstBytes, byte)
    }

    static func contains(_ set: (UInt64, UInt64, UInt64, UInt64), _ byte: UInt8) -> Bool {
        let bit = UInt64(1) << UInt64(byte & 63)
        switch byte >> 6 {
        case 0: return set.0 & bit != 0
        case 1: return set.1 & bit != 0
        case 2: return set.2 & bit != 0
        default: return set.3 & bit != 0
        }
    }

    /// The forms of one scalar: itself; its UTF-8 bytes percent-encoded, once and twice; `+`
    /// for a space; `\uXXXX` (UTF-16); the JSON short escape, if it has one.
    static func appendForms(of scalar: Unicode.Scalar, to units: inout [Unit], _ formStarts: inout [Int]) {
        func endForm() { formStarts.append(units.count) }
        let percent = UInt8(ascii: "%"), backslash = UInt8(ascii: "\\")
        var utf8: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        var count = 0
        UTF8.encode(scalar) { byte in
            switch count {
            case 0: utf8.0 = byte
            case 1: utf8.1 = byte
            case 2: utf8.2 = byte
            default: utf8.3 = byte
            }
            count += 1
        }
        func byte(_ i: Int) -> UInt8 {
            switch i {
            case 0: utf8.0
            case 1: utf8.1
            case 2: utf8.2
            default: utf8.3
            }
        }
        func hex(_ value: UInt8) {
            units.append(.hex(value >> 4))
            units.append(.hex(value & 0xF))
        }
        for i in 0..<count { units.append(.byte(byte(i))) }
        endForm()
        for i in 0..<count {
            units.append(.byte(percent))
            hex(byte(i))
        }
        endForm()
        for i in 0..<count {
            units.append(.byte(percent))
            units.append(.byte(UInt8(ascii: "2")))
            units.append(.byte(UInt8(ascii: "5")))
            hex(byte(i))
        }
        endForm()
        if scalar == " " {
            units.append(.byte(UInt8(ascii: "+")))
            endForm()
        }
        for unit in UTF16.encode(scalar)! {
            units.append(.byte(backslash))
            units.append(.byte(UInt8(ascii: "u")))
            hex(UInt8(unit >> 8))
            hex(UInt8(unit & 0xFF))
        }
        endForm()
        let letter: Unicode.Scalar? = switch scalar {
        case "/", "\"", "\\": scalar
        case "\u{08}": "b"
        case "\u{0C}": "f"
        case "\n": "n"
        case "\r": "r"
        case "\t": "t"
        default: nil
        }
        if let letter {
            units.append(.byte(backslash))
            units.append(.byte(UInt8(letter.value)))
            endForm()
        }
    }

    /// Reusable position sets for `match`.
    struct Scratch {
        var positions: [Int] = []
        var next: [Int] = []

        init() {
            positions.reserveCapacity(8)
            next.reserveCapacity(8)
        }
    }

    /// The end of the longest match starting at `start`, or nil. With `cutTailMatches`, a
    /// match still alive when the bytes run out ends at `bytes.count`.
    func match(_ bytes: [UInt8], at start: Int, cutTailMatches: Bool, _ scratch: inout Scratch) -> Int? {
        guard start < bytes.count, canBegin(bytes[start]) else { return nil }
        scratch.positions.removeAll(keepingCapacity: true)
        scratch.positions.append(start)
        var alive = false  // a form that the end of bytes interrupted
        for scalar in 0..<(scalarStarts.count - 1) {
            scratch.next.removeAll(keepingCapacity: true)
            for position in scratch.positions {
                if position == bytes.count { alive = true; continue }
                guard Self.contains(scalarFirstBytes[scalar], bytes[position]) else { continue }
                for form in scalarStarts[scalar]..<scalarStarts[scalar + 1] {
                    let formStart = formStarts[form], formEnd = formStarts[form + 1]
                    var offset = 0
                    while formStart + offset < formEnd, position + offset < bytes.count,
                          units[formStart + offset].matches(bytes[position + offset]) {
                        offset += 1
                    }
                    if formStart + offset == formEnd {
                        let end = position + offset
                        if !scratch.next.contains(end) { scratch.next.append(end) }
                    } else if position + offset == bytes.count {
                        alive = true
                    }
                }
            }
            if scratch.next.isEmpty {
                return cutTailMatches && alive ? bytes.count : nil
            }
            swap(&scratch.positions, &scratch.next)
        }
        return scratch.positions.max()
    }

    /// The first match anywhere in `bytes` (whole secrets only).
    func firstMatch(in bytes: [UInt8]) -> Range<Int>? {
        firstMatch(in: bytes, readings: ScalarReadings(bytes))
    }

    /// The same, with the text's readings made once for several secrets.
    func firstMatch(in bytes: [UInt8], readings: ScalarReadings) -> Range<Int>? {
        var scratch = Scratch()
        let starts = matchStarts(in: bytes, readings: readings, cutTailMatches: false)
        for start in bytes.indices where starts[start] {
            if let end = match(bytes, at: start, cutTailMatches: false, &scratch) { return start..<end }
        }
        return nil
    }
}
