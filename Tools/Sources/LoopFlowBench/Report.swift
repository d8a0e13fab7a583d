// The table (or JSON) and the allocation counts, which come from a helper process.
#if canImport(Glibc)
import Glibc
#endif

func report(_ rows: [Row], json: Bool) {
    if json {
        func number(_ value: Double) -> String { value.isFinite ? "\(value)" : "null" }
        func string(_ text: String) -> String {
            // A note may quote a tool's output: control characters are escaped too (RFC 8259).
            var escaped = "\""
            for scalar in text.unicodeScalars {
                switch scalar {
                case "\"", "\\": escaped += "\\" + String(scalar)
                case "\n": escaped += "\\n"
                case _ where scalar.value < 0x20:
                    let hex = String(scalar.value, radix: 16)
                    escaped += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                default: escaped.unicodeScalars.append(scalar)
                }
            }
            return escaped + "\""
        }
        let items = rows.map { row in
            var fields = [
                "\"name\":\(string(row.name))", "\"value\":\(number(row.ours))", "\"baseline\":\(number(row.floor))",
                "\"baseline_kind\":\(string(row.baseline))", "\"unit\":\(string(row.unit))",
                "\"ratio\":\(number(row.ratio))",
            ]
            if let note = row.note { fields.append("\"note\":\(string(note))") }
            if let target = row.target {
                fields.append("\"target\":\(string(target.text))")
                fields.append("\"met\":" + (target.met(by: row).map { $0 ? "true" : "false" } ?? "null"))
            }
            return "{" + fields.joined(separator: ",") + "}"
        }
        print("[" + items.joined(separator: ",\n") + "]")
        return
    }
    func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
    }
    func value(_ number: Double, _ unit: String) -> String {
        guard number.isFinite else { return "n/a" }
        return fixed(number, number < 100 && number != number.rounded() ? 1 : 0) + (unit.isEmpty ? "" : " " + unit)
    }
    print(pad("measure", 62) + pad("value", 12) + pad("baseline", 12) + pad("ratio", 9) + "target")
    for row in rows {
        let floor = row.floor.isFinite
            ? value(row.floor, row.unit) + (row.baseline == "raw libuv C" ? "" : " (\(row.baseline))") : "—"
        let ratio = row.ratio.isFinite ? fixed(row.ratio, 2) + "×" : "—"
        var target = ""
        if let goal = row.target {
            switch goal.met(by: row) {
            case true?: target = goal.text + " met"
            case false?: target = goal.text + " MISSED"
            case nil: target = goal.text + " (not measured)"
            }
        }
        let figure = !row.ours.isFinite && row.note != nil ? row.note! : value(row.ours, row.unit)
        print(pad(row.name, 62) + pad(figure, 12) + pad(floor, 12) + pad(ratio, 9) + target)
    }
}

/// Heap allocations per update, counted by `loopflow-allocs` under the malloc interposer.
func allocationRows(updates: Int, sizes: [Int], directory: String) -> [Row] {
    let helper = directory + "/loopflow-allocs"
    let interposer = directory + "/libMallocInterposerSwift.so"
    guard access(helper, X_OK) == 0, access(interposer, R_OK) == 0 else {
        note("allocations skipped: build the loopflow-allocs product (\(helper), \(interposer))")
        return sizes.map { allocationRow($0, .nan, .nan) } + pairRows(.nan, .nan)
    }
    let command = "LD_PRELOAD='\(interposer)' '\(helper)' \(updates) " + sizes.map(String.init).joined(separator: " ")
    guard let pipe = popen(command, "r") else {
        note("allocations skipped: cannot start \(helper)")
        return sizes.map { allocationRow($0, .nan, .nan) } + pairRows(.nan, .nan)
    }
    let (output, status) = drain(pipe)
    var counted: [Int: (Double, Double)] = [:]
    var pairs: (Double, Double) = (.nan, .nan)
    for line in output.split(separator: "\n") {
        let fields = line.split(separator: " ")
        guard fields.count == 3, let ours = Double(fields[1]), let other = Double(fields[2]) else { continue }
        if fields[0] == "pairs" {
            pairs = (ours, other)
        } else if let size = Int(fields[0]) {
            counted[size] = (ours, other)
        }
    }
    if status != 0 { note("allocations: \(helper) failed (status \(status))") }
    return sizes.map { size in allocationRow(size, counted[size]?.0 ?? .nan, counted[size]?.1 ?? .nan) }
        + pairRows(pairs.0, pairs.1)
}

/// Per subscribe+close pair, steady state, the loop's retire work included (no floor: the
/// floor's malloc+lock+free is one allocation by construction).
private func pairRows(_ onLoop: Double, _ foreign: Double) -> [Row] {
    [
        Row(name: "heap allocations per subscribe+close, loop thread", ours: onLoop, floor: 1, unit: "",
            target: .atMost(0), baseline: "malloc+lock+free"),
        Row(name: "heap allocations per subscribe+close, foreign thread", ours: foreign, floor: 1, unit: "",
            target: .atMost(0), baseline: "malloc+lock+free"),
    ]
}

private func allocationRow(_ subscribers: Int, _ ours: Double, _ floor: Double) -> Row {
    Row(
        name: "heap allocations per update, \(subscribers) subscriber\(subscribers == 1 ? "" : "s")",
        ours: ours, floor: floor, unit: "", target: .atMost(0))
}
