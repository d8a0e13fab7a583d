// The fuzz targets' replay: each target's file ends with a global initialized by
// `replay(<its LLVMFuzzerTestOneInput>)`, which a plain build's entry point runs: the executable
// runs the inputs it is given through the target once and checks the same properties (a
// violation traps). The test command replays Fuzz/corpus this way with the tools' debug build;
// scripts/fuzz.sh builds the targets with libFuzzer (-parse-as-library: the global never runs)
// and fuzzes.

import Foundation

/// Runs `target` once on each input in `arguments` (files; a directory: each file in it, in
/// name order), then exits: 0 when every input went through, 64 without arguments, 66 when
/// an input cannot be read. A broken property traps in `target` (the process dies).
public func replay(
    _ target: (UnsafeRawPointer?, Int) -> CInt, arguments: [String] = Array(CommandLine.arguments.dropFirst())
) -> Never {
    let name = URL(fileURLWithPath: CommandLine.arguments.first ?? "fuzz-target").lastPathComponent
    guard !arguments.isEmpty else {
        FileHandle.standardError.write(Data("""
            usage: \(name) INPUT...   each input (a file, or every file of a directory) run through the
            target once (this is a plain build; scripts/fuzz.sh builds the fuzzer)\n
            """.utf8))
        exit(64)
    }
    var inputs: [String] = []
    for path in arguments {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            let names = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
            inputs += names.sorted().map { path + "/" + $0 }
        } else {
            inputs.append(path)
        }
    }
    for input in inputs {
        guard let data = FileManager.default.contents(atPath: input) else {
            FileHandle.standardError.write(Data("\(name): cannot read \(input)\n".utf8))
            exit(66)
        }
        _ = data.withUnsafeBytes { target($0.baseAddress, $0.count) }
    }
    print("\(name): \(inputs.count) inputs replayed, every property held")
    exit(0)
}
