//! The web console: static files embedded in the binary and served at `/`
//! (the operating guide, `docs/guide/operating.md`, "The web console").
//!
//! The page is plain HTML, CSS and JavaScript modules (`app.js` the entry,
//! importing the helpers, the API and stream clients and one module per
//! page, all flat in `console/`), with no build step and nothing fetched
//! from elsewhere: it works on an air-gapped box.
//! It talks to the same REST routes and stream as any client, with the
//! token the operator types in (kept in the tab's `sessionStorage`, sent
//! as a header). The files are public — they hold no data — and are served
//! with a strict Content-Security-Policy (no inline script or style, no
//! other origin), `no-cache` with an `ETag` so a new binary's console is
//! picked up at once and an unchanged one costs a 304.

use super::api::ApiError;
use super::http::{Request, Response};

/// One embedded file.
struct File {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const FILES: &[File] = &[
    File {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("console/index.html"),
    },
    File {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/app.js"),
    },
    File {
        name: "dom.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/dom.js"),
    },
    File {
        name: "session.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/session.js"),
    },
    File {
        name: "api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/api.js"),
    },
    File {
        name: "dialogs.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/dialogs.js"),
    },
    File {
        name: "stream.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/stream.js"),
    },
    File {
        name: "chart.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/chart.js"),
    },
    File {
        name: "overview.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/overview.js"),
    },
    File {
        name: "events.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/events.js"),
    },
    File {
        name: "runs.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/runs.js"),
    },
    File {
        name: "dead_letters.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/dead_letters.js"),
    },
    File {
        name: "rules.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/rules.js"),
    },
    File {
        name: "reactions.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/reactions.js"),
    },
    File {
        name: "followers.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/followers.js"),
    },
    File {
        name: "schedules.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/schedules.js"),
    },
    File {
        name: "audit.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("console/audit.js"),
    },
    File {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("console/style.css"),
    },
    File {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("console/favicon.svg"),
    },
];

/// What the page may load and do: its own files and API, nothing inline,
/// nothing from elsewhere, not framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The names of the console's files.
pub(crate) fn names() -> Vec<&'static str> {
    FILES.iter().map(|f| f.name).collect()
}

/// The file `name` (`index.html` for `/`), or 404.
pub(crate) fn serve(req: &Request, name: &str) -> Result<Response, ApiError> {
    let file = FILES
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| ApiError::not_found(format!("no console file {name:?}")))?;
    let etag = format!("\"{:016x}\"", fnv1a(file.body));
    let fresh = req
        .header("if-none-match")
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let (status, body) = if fresh {
        (304, Vec::new())
    } else {
        (200, file.body.to_vec())
    };
    Ok(Response {
        status,
        content_type: file.content_type,
        body,
        headers: vec![
            ("Cache-Control", "no-cache".into()),
            ("ETag", etag),
            ("Content-Security-Policy", CSP.into()),
            ("X-Frame-Options", "DENY".into()),
            ("Referrer-Policy", "no-referrer".into()),
            ("Cross-Origin-Opener-Policy", "same-origin".into()),
        ],
        close: false,
        head_only: false,
    })
}

/// A 64-bit FNV-1a hash: the files' ETags (not a security measure).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_there_and_the_page_loads_only_its_own() {
        let html = std::str::from_utf8(FILES[0].body).unwrap();
        for f in FILES {
            assert!(!f.body.is_empty(), "{}", f.name);
        }
        // No inline script or style: the CSP would refuse them.
        assert!(!html.contains("<script>"));
        assert!(!html.contains("style="));
        assert!(html.contains(r#"src="/console/app.js""#));
        assert!(!html.contains("http://") && !html.contains("https://"));
    }

    #[test]
    fn every_module_a_script_imports_is_served() {
        // A module missing from FILES would be a 404 only the browser sees.
        for f in FILES.iter().filter(|f| f.name.ends_with(".js")) {
            let js = std::str::from_utf8(f.body).unwrap();
            for line in js.lines().filter(|l| l.starts_with("import ")) {
                let from = line.split(" from './").nth(1);
                let name = from.and_then(|s| s.strip_suffix("';"));
                let name = name.unwrap_or_else(|| panic!("{}: {line:?}", f.name));
                assert!(
                    FILES.iter().any(|g| g.name == name),
                    "{} imports {name}, which is not served",
                    f.name
                );
            }
        }
    }
}
