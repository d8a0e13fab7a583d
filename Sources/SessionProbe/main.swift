// A second process for the multi-process tests: opens a shared file store, asks for a
// fresh access token through the OAuth 2.0 authority, and prints a digest of it (never
// the token), the state, and what it saw.
//
//   session-probe STORE_DIR TOKEN_ENDPOINT CLIENT_ID
import Crypto
import Foundation
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

let arguments = CommandLine.arguments
guard arguments.count == 4, let endpoint = URL(string: arguments[2]) else {
    FileHandle.standardError.write(Data("usage: session-probe STORE_DIR TOKEN_ENDPOINT CLIENT_ID\n".utf8))
    exit(2)
}

let loop = try EventLoop(name: "probe")
let authority = OAuthAuthority(OAuthConfiguration(tokenEndpoint: endpoint, clientID: arguments[3]))
let manager = try SessionManager(loop: loop, authority: authority, store: FileCredentialStore(directory: arguments[1]))
do {
    let token = try await manager.freshAccessToken()
    let digest = SHA256.hash(data: Data(token.reveal().utf8)).map { String(format: "%02x", $0) }.joined()
    print("TOKEN-SHA256 \(digest.prefix(16))")
    print("STATE \(manager.state.value)")
} catch {
    print("ERROR \(error)")
}
await manager.close()
try loop.shutdown()
