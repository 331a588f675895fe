//! CSV files of serialisable rows (one struct per line, its fields the columns).

use serde::Serialize;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

/// `rows` as CSV bytes, with the header line first when `header` is set.
pub fn to_bytes<T: Serialize>(rows: &[T], header: bool) -> Result<Vec<u8>, csv::Error> {
    let mut writer = csv::WriterBuilder::new()
        .has_headers(header)
        .from_writer(Vec::new());
    for row in rows {
        writer.serialize(row)?;
    }
    writer.into_inner().map_err(|e| e.into_error().into())
}

/// Appends `rows` to the CSV file at `path`, writing the header first when the file is new or
/// empty, and flushes so that a killed process loses no finished row. A non-empty file must
/// start with the same header (else the error says `mismatch`): rows are never appended under
/// another table's columns.
pub fn append<T: Serialize>(path: &Path, rows: &[T], mismatch: &str) -> std::io::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let bytes = to_bytes(rows, true).map_err(std::io::Error::other)?;
    let header_len = bytes.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    let body = if file.metadata()?.len() > 0 {
        let mut first = String::new();
        BufReader::new(&file).read_line(&mut first)?;
        let header = String::from_utf8_lossy(&bytes[..header_len]);
        if first.trim_end() != header.trim_end() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                mismatch.to_string(),
            ));
        }
        &bytes[header_len..]
    } else {
        &bytes[..]
    };
    file.write_all(body)?;
    file.flush()
}

/// A table of text cells as CSV bytes, `header` first (for tables whose columns are known only
/// at run time).
pub fn table_bytes<S: AsRef<str>>(
    header: &[S],
    rows: &[Vec<String>],
) -> Result<Vec<u8>, csv::Error> {
    let mut writer = csv::WriterBuilder::new().from_writer(Vec::new());
    writer.write_record(header.iter().map(AsRef::as_ref))?;
    for row in rows {
        writer.write_record(row)?;
    }
    writer.into_inner().map_err(|e| e.into_error().into())
}
