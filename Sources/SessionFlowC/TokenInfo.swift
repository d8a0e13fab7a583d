import CSessionFlow
import SessionCore

@c @implementation
public func sf_session_token_info(_ pointer: OpaquePointer!, _ out: UnsafeMutablePointer<sf_token_info>!) -> Int32 {
    api("sf_session_token_info") {
        guard let out else { return SF_EINVAL.code }
        let declared = out.pointee.size
        guard acceptedSize(declared, [MemoryLayout<sf_token_info>.size]) else {
            refuse(
                "sf_session_token_info", pointer,
                "sf_token_info.size is \(declared), not \(MemoryLayout<sf_token_info>.size) (set it to sizeof(sf_token_info))")
            return SF_EINVAL.code
        }
        return withRuntime(pointer) { runtime in
            guard let info = runtime.session.tokenInfo else {
                explain("no access token: signed out, or the session expired")
                return SF_ESTATE.code
            }
            var filled = sf_token_info()
            filled.size = declared
            withUnsafeMutableBytes(of: &filled.token_type) { field in
                let bytes = Array(info.tokenType.utf8.prefix(field.count - 1))
                field.copyBytes(from: bytes)
                field[bytes.count] = 0
            }
            filled.expires_in_ms = info.expiresIn.map(milliseconds) ?? Int64.min
            filled.expires_at_unix_ms = info.expiresAtUnixMilliseconds ?? 0
            out.pointee = filled
            return SF_OK.code
        }
    }
}

@c @implementation
public func sf_session_token_scope(_ pointer: OpaquePointer!, _ buffer: UnsafeMutablePointer<CChar>!, _ length: Int) -> Int32 {
    api("sf_session_token_scope") {
        guard let buffer else { return SF_EINVAL.code }
        return withRuntime(pointer) { runtime in
            copy(Array((runtime.session.tokenInfo?.scope ?? "").utf8), to: buffer, length: length)
        }
    }
}
