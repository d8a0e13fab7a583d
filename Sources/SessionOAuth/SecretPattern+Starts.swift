// Standard library only: SessionOAuth is leaving Foundation (issue 13).

/// Every way a text can be read as one Unicode scalar at each position, in the forms
/// `SecretPattern.appendForms` knows: the scalar's own UTF-8 bytes; its bytes
/// percent-encoded once (`%E2%82%AC`) or twice (`%25E2%2582…`), hexadecimal digits in either
/// case; `+` for a space; a JSON `\uXXXX` escape (a surrogate pair for a scalar beyond
/// U+FFFF); a JSON short escape (`\/ \" \\ \b \f \n \r \t`). At most six readings a position,
/// each found by looking at no more than 20 bytes, so making them is linear in the text. They
/// depend on the text only: one set serves every secret a scan looks for.
///
/// A reading exists exactly when some form of its scalar spells the bytes from the position to
/// its end (UTF-8 is prefix-free and strictly decoded: an overlong or surrogate encoding is no
/// scalar, as no form of a scalar spells it).
struct ScalarReadings {
    /// The readings of position p are `scalars[first[p]..<first[p + 1]]`, ending (exclusive)
    /// at `ends[…]`.
    private(set) var scalars: [Unicode.Scalar] = []
    private(set) var ends: [Int] = []
    private(set) var first: [Int] = []

    /// The longest reading, in bytes: four UTF-8 bytes percent-encoded twice.
    static let longest = 20

    init(_ bytes: [UInt8]) {
        first.reserveCapacity(bytes.count + 1)
        scalars.reserveCapacity(bytes.count)
        ends.reserveCapacity(bytes.count)
        for position in bytes.indices {
            first.append(scalars.count)
            read(bytes, at: position)
        }
        first.append(scalars.count)
    }

    func readings(at position: Int) -> Range<Int> { first[position]..<first[position + 1] }

    private mutating func add(_ scalar: Unicode.Scalar?, end: Int) {
        guard let scalar else { return }
        scalars.append(scalar)
        ends.append(end)
    }

    private mutating func read(_ bytes: [UInt8], at p: Int) {
        let count = bytes.count
        func byte(_ i: Int) -> UInt8? { i < count ? bytes[i] : nil }
        func hexByte(_ i: Int) -> UInt8? {
            guard let high = byte(i).flatMap(Self.hexValue), let low = byte(i + 1).flatMap(Self.hexValue) else { return nil }
            return high << 4 | low
        }
        // The scalar's own bytes.
        if let length = Self.utf8Length(bytes[p]), p + length <= count {
            add(Self.utf8Scalar({ bytes[p + $0] }, length: length), end: p + length)
        }
        let percent = UInt8(ascii: "%"), backslash = UInt8(ascii: "\\")
        if bytes[p] == percent {
            // Percent-encoded once: each UTF-8 byte as %HH.
            if let lead = hexByte(p + 1), let length = Self.utf8Length(lead) {
                var encoded: [UInt8] = [lead]
                for i in 1..<length {
                    guard byte(p + 3 * i) == percent, let next = hexByte(p + 3 * i + 1) else { break }
                    encoded.append(next)
                }
                if encoded.count == length {
                    add(Self.utf8Scalar({ encoded[$0] }, length: length), end: p + 3 * length)
                }
            }
            // Percent-encoded twice: each UTF-8 byte as %25HH.
            func twice(_ i: Int) -> UInt8? {
                guard byte(i) == percent, byte(i + 1) == UInt8(ascii: "2"), byte(i + 2) == UInt8(ascii: "5") else { return nil }
                return hexByte(i + 3)
            }
            if let lead = twice(p), let length = Self.utf8Length(lead) {
                var encoded: [UInt8] = [lead]
                for i in 1..<length {
                    guard let next = twice(p + 5 * i) else { break }
                    encoded.append(next)
                }
                if encoded.count == length {
                    add(Self.utf8Scalar({ encoded[$0] }, length: length), end: p + 5 * length)
                }
            }
        }
        if bytes[p] == UInt8(ascii: "+") {
            add(" ", end: p + 1)
        }
        if bytes[p] == backslash, let next = byte(p + 1) {
            // A JSON short escape.
            let short: Unicode.Scalar? = switch next {
            case UInt8(ascii: "/"): "/"
            case UInt8(ascii: "\""): "\""
            case backslash: "\\"
            case UInt8(ascii: "b"): "\u{08}"
            case UInt8(ascii: "f"): "\u{0C}"
            case UInt8(ascii: "n"): "\n"
            case UInt8(ascii: "r"): "\r"
            case UInt8(ascii: "t"): "\t"
            default: nil
            }
            add(short, end: p + 2)
            // \uXXXX: one UTF-16 unit, or a surrogate pair.
            func unit(_ i: Int) -> UInt16? {
                guard byte(i) == backslash, byte(i + 1) == UInt8(ascii: "u"),
                      let high = hexByte(i + 2), let low = hexByte(i + 4) else { return nil }
                return UInt16(high) << 8 | UInt16(low)
            }
            if let first = unit(p) {
                switch first {
                case 0xD800...0xDBFF:
                    if let second = unit(p + 6), (0xDC00...0xDFFF).contains(second) {
                        let value = 0x10000 + (UInt32(first - 0xD800) << 10) + UInt32(second - 0xDC00)
                        add(Unicode.Scalar(value), end: p + 12)
                    }
                case 0xDC00...0xDFFF:
                    break
                default:
                    add(Unicode.Scalar(UInt32(first)), end: p + 6)
                }
            }
        }
    }

    static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): b - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): b - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// The length of the UTF-8 sequence `lead` begins, or nil for a byte no sequence begins with.
    static func utf8Length(_ lead: UInt8) -> Int? {
        switch lead {
        case 0x00...0x7F: 1
        case 0xC2...0xDF: 2
        case 0xE0...0xEF: 3
        case 0xF0...0xF4: 4
        default: nil
        }
    }

    /// The scalar `length` bytes (`byte(0)` the lead) encode, strictly: nil for a bad
    /// continuation byte, an overlong form, a surrogate or a value beyond U+10FFFF.
    static func utf8Scalar(_ byte: (Int) -> UInt8, length: Int) -> Unicode.Scalar? {
        let lead = byte(0)
        if length == 1 { return Unicode.Scalar(lead) }
        var value = UInt32(lead) & (length == 2 ? 0x1F : length == 3 ? 0x0F : 0x07)
        for i in 1..<length {
            let next = byte(i)
            guard next & 0xC0 == 0x80 else { return nil }
            value = value << 6 | UInt32(next & 0x3F)
        }
        let smallest: UInt32 = length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000
        guard value >= smallest else { return nil }
        return Unicode.Scalar(value)  // nil for a surrogate or beyond U+10FFFF
    }
}

extension SecretPattern {
    /// For each position of `bytes`, whether `match(bytes, at: position, cutTailMatches:)`
    /// finds a match there — computed for all positions at once, from the end of the text
    /// back, as sets of the secret's scalar indices (bit-parallel, `maskWords` words a set):
    ///
    /// - `full[p]` holds j when the bytes from p on begin with the secret's scalars j..<m in
    ///   some forms (m always: nothing is left to read). A match starts at p when it holds 0.
    /// - `tail[p]` (only with `cutTailMatches`) holds j < m when the bytes from p to the end
    ///   read as scalars j..<k (k < m) followed by nothing, or by part of a form of scalar k
    ///   — a match the end of the text interrupted, which `match` counts as a match to the end.
    ///
    /// A reading of scalar c from p to q gives p the indices j with scalar j == c and j + 1
    /// in q's set: `(set[q] >> 1) & mask[c]`. Readings are at most `ScalarReadings.longest`
    /// bytes long, so only the sets of the next 32 positions are kept (a ring). Cost: the
    /// text's readings (at most six a position) times `maskWords`; no backtracking.
    func matchStarts(in bytes: [UInt8], readings: ScalarReadings, cutTailMatches: Bool) -> [Bool] {
        let count = bytes.count, words = maskWords, m = scalarCount
        var starts = [Bool](repeating: false, count: count)
        guard count > 0 else { return starts }
        let ringSize = 32
        precondition(ScalarReadings.longest < ringSize)
        var full = [UInt64](repeating: 0, count: ringSize * words)
        var tail = [UInt64](repeating: 0, count: cutTailMatches ? ringSize * words : 0)
        func slot(_ position: Int) -> Int { (position & (ringSize - 1)) * words }
        let endBit = (index: m / 64, bit: UInt64(1) << UInt64(m % 64))
        full[slot(count) + endBit.index] = endBit.bit
        if cutTailMatches {
            for j in 0..<m { tail[slot(count) + j / 64] |= UInt64(1) << UInt64(j % 64) }
        }
        for position in stride(from: count - 1, through: 0, by: -1) {
            let here = slot(position)
            for w in 0..<words {
                full[here + w] = 0
                if cutTailMatches { tail[here + w] = 0 }
            }
            full[here + endBit.index] = endBit.bit
            for reading in readings.readings(at: position) {
                guard let row = distinctScalars[readings.scalars[reading]]?.row else { continue }
                let there = slot(readings.ends[reading]), mask = row * words
                for w in 0..<words {
                    let carry = w + 1 < words ? full[there + w + 1] << 63 : 0
                    full[here + w] |= (full[there + w] >> 1 | carry) & masks[mask + w]
                }
                if cutTailMatches {
                    for w in 0..<words {
                        let carry = w + 1 < words ? tail[there + w + 1] << 63 : 0
                        tail[here + w] |= (tail[there + w] >> 1 | carry) & masks[mask + w]
                    }
                }
            }
            if cutTailMatches && count - position < ScalarReadings.longest {
                // The end of the text inside a form: which scalars have a form it begins.
                for (_, entry) in distinctScalars where beginsAForm(of: entry.index, bytes, from: position) {
                    for w in 0..<words { tail[here + w] |= masks[entry.row * words + w] }
                }
            }
            starts[position] = full[here] & 1 != 0 || (cutTailMatches && tail[here] & 1 != 0)
        }
        return starts
    }

    /// Whether `bytes[position...]` is the beginning (not the whole) of a form of the
    /// secret's scalar `index`.
    private func beginsAForm(of index: Int, _ bytes: [UInt8], from position: Int) -> Bool {
        let length = bytes.count - position
        for form in scalarStarts[index]..<scalarStarts[index + 1] {
            let formStart = formStarts[form], formEnd = formStarts[form + 1]
            guard length < formEnd - formStart else { continue }
            var offset = 0
            while offset < length, units[formStart + offset].matches(bytes[position + offset]) { offset += 1 }
            if offset == length { return true }
        }
        return false
    }
}
