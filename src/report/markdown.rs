//! Markdown tables.

/// A table: the header row, the separator and one line per row, each line ending in a
/// newline. Cells are written as given (see [`cell`]).
pub fn table<H: AsRef<str>, S: AsRef<str>>(header: &[H], rows: &[Vec<S>]) -> String {
    let header: Vec<&str> = header.iter().map(AsRef::as_ref).collect();
    let mut s = format!("| {} |\n", header.join(" | "));
    s += &format!("|{}\n", "---|".repeat(header.len()));
    for row in rows {
        let cells: Vec<&str> = row.iter().map(AsRef::as_ref).collect();
        s += &format!("| {} |\n", cells.join(" | "));
    }
    s
}

/// Text for a table cell: `|` escaped, line breaks as spaces.
pub fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_header_separator_and_rows() {
        let rows = vec![vec!["1".to_string(), cell("x|y")]];
        assert_eq!(
            table(&["a", "b"], &rows),
            "| a | b |\n|---|---|\n| 1 | x\\|y |\n"
        );
    }
}
