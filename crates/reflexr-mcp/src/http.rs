//! MCP's Streamable HTTP transport, JSON responses only, without the HTTP
//! server: one POSTed message in, a status and a body out. The server that
//! calls it (`reflexr-admin`'s `POST /api/v1/mcp`) owns the rest of HTTP —
//! the connection, `Host` and `Origin`, the token, media types.

use serde_json::{Value, json};

use reflexr::Backend;

use super::{Head, LEGACY_VERSIONS, MODERN_VERSIONS, Mcp, RpcError, code};

/// What to answer one POSTed message.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HttpAnswer {
    /// 200 (a result, or a JSON-RPC error about the call), 202 (a
    /// notification or a response: nothing to say), 400 (not JSON, not a
    /// request, a header that disagrees with the body, an unsupported
    /// version), 404 (an unknown method, in the 2026-07-28 revision).
    pub status: u16,
    /// The JSON-RPC answer; none with 202.
    pub body: Option<Value>,
}

impl<B: Backend> Mcp<B> {
    /// Answers one message POSTed to MCP's Streamable HTTP endpoint.
    /// `header` gives the request's headers by lower-case name: in the
    /// 2026-07-28 revision `MCP-Protocol-Version`, `Mcp-Method` and
    /// (for a call or a read) `Mcp-Name` must say what the body says; in
    /// the older ones an `MCP-Protocol-Version` must be one this server
    /// speaks.
    pub fn handle_http<'h>(
        &self,
        header: &dyn Fn(&str) -> Option<&'h str>,
        body: &str,
    ) -> HttpAnswer {
        let header = |n: &str| -> Option<&'h str> { header(n).map(str::trim) };
        let check = |h: &Head<'_>| -> Result<(), RpcError> {
            let mismatch = |what: &str| {
                Err(RpcError::new(
                    code::HEADER_MISMATCH,
                    format!("the {what} header must say what the body says"),
                ))
            };
            match h.meta_version {
                Some(v) => {
                    if header("mcp-protocol-version") != Some(v) {
                        return mismatch("MCP-Protocol-Version");
                    }
                    if header("mcp-method") != Some(h.method) {
                        return mismatch("Mcp-Method");
                    }
                    let named = matches!(h.method, "tools/call" | "resources/read" | "prompts/get");
                    if named && header("mcp-name") != h.name {
                        return mismatch("Mcp-Name");
                    }
                }
                None => {
                    if let Some(v) = header("mcp-protocol-version")
                        && !LEGACY_VERSIONS.contains(&v)
                        && !MODERN_VERSIONS.contains(&v)
                    {
                        return Err(RpcError::new(
                            code::UNSUPPORTED_VERSION,
                            "Unsupported protocol version",
                        )
                        .with_data(json!({
                            "supported": MODERN_VERSIONS.iter().chain(LEGACY_VERSIONS).collect::<Vec<_>>(),
                            "requested": v,
                        })));
                    }
                }
            }
            Ok(())
        };
        let out = self.dispatch_checked(body, &check);
        let Some(reply) = out.reply else {
            return HttpAnswer {
                status: 202,
                body: None,
            };
        };
        let modern = out.meta_version.is_some();
        let status = match out.error {
            Some(
                code::PARSE
                | code::INVALID_REQUEST
                | code::HEADER_MISMATCH
                | code::UNSUPPORTED_VERSION,
            ) => 400,
            Some(code::INVALID_PARAMS) if out.era.is_none() => 400,
            Some(code::METHOD_NOT_FOUND) if modern => 404,
            _ => 200,
        };
        HttpAnswer {
            status,
            body: Some(reply),
        }
    }
}
