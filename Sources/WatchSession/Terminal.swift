/// What reaches the terminal from outside — a server's error text, a user code, a URL, an
/// account name, a store path, a member id — is shown, never obeyed: every control character
/// (C0, DEL, C1) and every invisible formatting character (bidirectional overrides and
/// isolates, zero-width joiners, the BOM...) is printed as its Swift escape, `\u{1B}`. A
/// newline in such text is `\u{A}`, so it cannot start a line of its own. Applied where text
/// is written (`Presenter`'s sink, the error lines on standard error), not where it is
/// made: no path can forget it. The library's own colours are added after escaping.
enum Terminal {
    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            if needsEscape(scalar) {
                out += "\\u{\(String(scalar.value, radix: 16, uppercase: true))}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// C0, DEL and C1 (general category Cc), formatting characters (Cf: the bidi controls
    /// U+202A–U+202E and U+2066–U+2069, U+200B–U+200F, U+FEFF...), the line and paragraph
    /// separators, and private-use characters (a terminal may map them to anything).
    static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator, .privateUse, .surrogate, .unassigned:
            return true
        default:
            return false
        }
    }

    /// NDJSON lines: JSON already escapes C0, but not DEL, C1 or the formatting characters,
    /// which a terminal would act on. They become JSON escapes (`\u009b`): the same string to
    /// a JSON reader, inert on a terminal.
    static func escapeJSON(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            if needsEscape(scalar) {
                for unit in String(scalar).utf16 {
                    let hex = String(unit, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                }
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// `text` without the white space (spaces, tabs, line ends) at either end.
    static func trimmed(_ text: String) -> String {
        let kept = text.drop { $0.isWhitespace }
        return String(kept.reversed().drop { $0.isWhitespace }.reversed())
    }

    /// A line for standard error: `watch-session: <message>`, the message escaped.
    static func errorLine(_ message: String) -> String {
        "watch-session: \(escape(message))\n"
    }
}
