/// A token or other secret. It prints as `<redacted>` everywhere — `description`,
/// `debugDescription`, string interpolation, `dump`, `Mirror` — so it cannot reach a
/// log, an error message or CLI output by accident. Read the text with `reveal()`, only
/// where it must leave the process (an HTTP header, a form body, the encrypted store).
public struct Secret: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    private let text: String

    public init(_ text: String) {
        self.text = text
    }

    /// The secret itself. Never log it.
    public func reveal() -> String { text }

    /// Whether it is empty or only white space (a "blank" token counts as no token).
    public var isBlank: Bool { text.allSatisfy(\.isWhitespace) }

    public var description: String { "<redacted>" }
    public var debugDescription: String { "<redacted>" }
    public var customMirror: Mirror { Mirror(self, children: [], displayStyle: .struct) }
}
