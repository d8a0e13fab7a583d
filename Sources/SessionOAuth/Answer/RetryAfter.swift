#if canImport(Glibc)
import Glibc
#endif

/// `Retry-After`: delay-seconds or an HTTP-date.
@_spi(Fuzzing) public enum RetryAfter {
    /// `Retry-After` (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date in the IMF-fixdate
    /// form ("Sun, 06 Nov 1994 08:49:37 GMT"), parsed by hand (ASCII only): anything else is
    /// nil. (Foundation's DateFormatter trapped on a combining mark a server can send.)
    public static func parse(_ value: String?) -> Duration? {
        guard let value, value.utf8.count <= 64 else { return nil }
        // (delay-seconds is 1*DIGIT: "+5" and "-1" are not Retry-After values.)
        let bytes = Array(value.utf8.drop { $0 == 0x20 || $0 == 0x09 }.reversed().drop { $0 == 0x20 || $0 == 0x09 }.reversed())
        guard !bytes.isEmpty, bytes.allSatisfy({ $0 < 0x80 }) else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        if bytes.allSatisfy({ (0x30...0x39).contains($0) }) {
            // More digits than an Int holds: absurdly far; the session caps what it honours.
            guard let seconds = Int(text) else { return .seconds(100 * 365 * 24 * 3600) }
            return .seconds(seconds)
        }
        guard let date = imfFixdate(text) else { return nil }
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return .seconds(max(date - Int64(now.tv_sec), 0))
    }

    /// Seconds since the Unix epoch of an IMF-fixdate, or nil.
    static func imfFixdate(_ text: String) -> Int64? {
        let parts = text.split(separator: " ", omittingEmptySubsequences: false)
        let days = ["Mon,", "Tue,", "Wed,", "Thu,", "Fri,", "Sat,", "Sun,"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard parts.count == 6, days.contains(String(parts[0])), parts[5] == "GMT",
              parts[1].count == 2, let day = Int(parts[1]), (1...31).contains(day),
              let month = months.firstIndex(of: String(parts[2])),
              parts[3].count == 4, let year = Int(parts[3]), year >= 1970
        else { return nil }
        let clock = parts[4].split(separator: ":", omittingEmptySubsequences: false)
        guard clock.count == 3, clock.allSatisfy({ $0.count == 2 }),
              let hour = Int(clock[0]), let minute = Int(clock[1]), let second = Int(clock[2]),
              hour < 24, minute < 60, second < 61
        else { return nil }
        // Days since 1970-01-01 (civil-from-days, proleptic Gregorian).
        let y = Int64(month < 2 ? year - 1 : year)
        let m = Int64(month < 2 ? month + 13 : month + 1)   // March = 3 ... February = 14
        let era = y / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (m - 3) + 2) / 5 + Int64(day) - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days1970 = era * 146_097 + dayOfEra - 719_468
        return days1970 * 86_400 + Int64(hour * 3600 + minute * 60 + second)
    }
}
