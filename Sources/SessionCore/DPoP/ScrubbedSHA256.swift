/// SHA-256 (FIPS 180-4) of a secret, leaving no copy of it behind: the `ath` of a DPoP proof
/// hashes the access token. swift-crypto's `SHA256` keeps the input's last partial block in a
/// context it copies and frees uncleansed at `finalize()` (the C memory scan found the whole
/// 42-byte access token in a freed block under AddressSanitizer), so the hash is computed here:
/// the message block and schedule in stack memory of this call, zeroed before it returns. Only
/// the digest, which is public (it is in the proof), leaves. Checked against swift-crypto in
/// `DPoPProofTests`.
enum ScrubbedSHA256 {
    private static let k: [UInt32] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ]

    /// The 32-byte digest of `message`.
    static func hash(_ message: UnsafeRawBufferPointer) -> [UInt8] {
        var h: (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32) = (
            0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19)
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 64) { block in
            withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 64) { w in
                defer {
                    for i in 0..<64 { block[i] = 0 }
                    for i in 0..<64 { w[i] = 0 }
                }
                let length = message.count
                // The message, then 0x80, zeros and the bit length: whole blocks of 64 bytes.
                let total = (length + 9 + 63) / 64 * 64
                var offset = 0
                while offset < total {
                    for i in 0..<64 {
                        let at = offset + i
                        if at < length {
                            block[i] = message[at]
                        } else if at == length {
                            block[i] = 0x80
                        } else if at >= total - 8 {
                            let shift = UInt64(8 * (total - 1 - at))
                            block[i] = UInt8(truncatingIfNeeded: (UInt64(length) &* 8) >> shift)
                        } else {
                            block[i] = 0
                        }
                    }
                    compress(block, w, &h)
                    offset += 64
                }
            }
        }
        var digest = [UInt8]()
        digest.reserveCapacity(32)
        for word in [h.0, h.1, h.2, h.3, h.4, h.5, h.6, h.7] {
            digest += [UInt8(word >> 24), UInt8(truncatingIfNeeded: word >> 16), UInt8(truncatingIfNeeded: word >> 8),
                       UInt8(truncatingIfNeeded: word)]
        }
        return digest
    }

    private static func compress(
        _ block: UnsafeMutableBufferPointer<UInt8>, _ w: UnsafeMutableBufferPointer<UInt32>,
        _ h: inout (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32)
    ) {
        for t in 0..<16 {
            w[t] = UInt32(block[4 * t]) << 24 | UInt32(block[4 * t + 1]) << 16 | UInt32(block[4 * t + 2]) << 8
                | UInt32(block[4 * t + 3])
        }
        for t in 16..<64 {
            let s0 = rotate(w[t - 15], 7) ^ rotate(w[t - 15], 18) ^ (w[t - 15] >> 3)
            let s1 = rotate(w[t - 2], 17) ^ rotate(w[t - 2], 19) ^ (w[t - 2] >> 10)
            w[t] = w[t - 16] &+ s0 &+ w[t - 7] &+ s1
        }
        var (a, b, c, d, e, f, g, hh) = h
        for t in 0..<64 {
            let s1 = rotate(e, 6) ^ rotate(e, 11) ^ rotate(e, 25)
            let choice = (e & f) ^ (~e & g)
            let t1 = hh &+ s1 &+ choice &+ k[t] &+ w[t]
            let s0 = rotate(a, 2) ^ rotate(a, 13) ^ rotate(a, 22)
            let majority = (a & b) ^ (a & c) ^ (b & c)
            let t2 = s0 &+ majority
            hh = g
            g = f
            f = e
            e = d &+ t1
            d = c
            c = b
            b = a
            a = t1 &+ t2
        }
        h = (h.0 &+ a, h.1 &+ b, h.2 &+ c, h.3 &+ d, h.4 &+ e, h.5 &+ f, h.6 &+ g, h.7 &+ hh)
    }

    @inline(__always)
    private static func rotate(_ x: UInt32, _ n: UInt32) -> UInt32 { (x >> n) | (x << (32 - n)) }
}
