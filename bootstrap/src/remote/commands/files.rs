//! `cat`: a file on the host written to stdout as it is, read a page at a time with `fs/read`
//! (docs/protocol.md §7.8).

use super::call_resending;
use crate::remote::Failure;
use crate::remote::out::Out;
use base64::Engine;
use racp_proto::calls;
use racp_proto::client::RacpClient;
use racp_proto::limits::MAX_READ_BYTES;
use racp_proto::methods::fs::{FsReadParams, ReadEncoding};
use std::io::Write;

/// Writes the file's bytes to stdout, text or binary alike; with `--json`, one page result per
/// line. A file that changes while it is read is refused rather than printed half old, half new.
pub async fn cat(out: &Out, client: &RacpClient, path: String) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    let (mut offset, mut first_hash) = (0u64, None::<String>);
    loop {
        let params = FsReadParams {
            path: path.clone(),
            offset: Some(offset),
            length: Some(MAX_READ_BYTES),
            encoding: Some(ReadEncoding::Base64),
        };
        let page = call_resending::<calls::FsRead>(client, params).await?;
        if first_hash.get_or_insert_with(|| page.sha256.clone()) != &page.sha256 {
            return Err(Failure::Local(format!(
                "{path} changed while it was read: run cat again"
            )));
        }
        if out.json {
            out.json_value(&page);
        } else {
            let data = page.data.as_deref().unwrap_or_default();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|e| {
                    Failure::Local(format!("the host sent a page that is not base64: {e}"))
                })?;
            stdout
                .write_all(&bytes)
                .map_err(|e| Failure::Local(format!("cannot write the file: {e}")))?;
        }
        offset += page.length;
        if page.eof || page.length == 0 {
            break;
        }
    }
    stdout
        .flush()
        .map_err(|e| Failure::Local(format!("cannot write the file: {e}")))
}
