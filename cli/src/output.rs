//! Printing query results: table (fitted to the terminal, or expanded one column per line),
//! CSV, JSON, NDJSON, Markdown.

use crate::args::OutputFormat;
use crate::fit;
use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use datafusion::arrow::json::writer::{make_encoder, EncoderOptions};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use std::io::Write;
use std::sync::Arc;

/// psql's `\x`: one line per column and value instead of one line per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expanded {
    #[default]
    Off,
    On,
    /// Expanded only when the table does not fit the terminal even with its text columns
    /// shortened to [`fit::MIN_TEXT_WIDTH`]; its values are then shortened to the width too.
    Auto,
}

/// How a table is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub expanded: Expanded,
    /// Characters a table may use; long text cells are shortened to fit.
    pub width: usize,
}

impl Layout {
    /// Not expanded, as wide as the terminal ([`fit::terminal_width`]).
    pub fn terminal() -> Layout {
        Layout {
            expanded: Expanded::Off,
            width: fit::terminal_width(),
        }
    }
}

/// Writes `batches` in `format`, tables fitted to the terminal.
pub fn write_batches(
    out: &mut dyn Write,
    format: OutputFormat,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> anyhow::Result<()> {
    write_batches_with(out, format, schema, batches, Layout::terminal())
}

/// Writes `batches` in `format`; `layout` applies to tables.
pub fn write_batches_with(
    out: &mut dyn Write,
    format: OutputFormat,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    layout: Layout,
) -> anyhow::Result<()> {
    match format {
        OutputFormat::Table => write_table(out, schema, batches, layout)?,
        OutputFormat::Csv => {
            // CSV has no nested values: maps, lists and structs (the runs' `tags`) become
            // their JSON text in one cell.
            let schema = flat_schema(schema);
            let mut w = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut *out);
            if batches.is_empty() {
                w.write(&RecordBatch::new_empty(schema.clone()))?;
            }
            for b in batches {
                w.write(&flatten_nested(b, &schema)?)?;
            }
        }
        OutputFormat::Json => {
            let mut w = datafusion::arrow::json::ArrayWriter::new(&mut *out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
            if batches.iter().all(|b| b.num_rows() == 0) {
                write!(out, "[]")?;
            }
            writeln!(out)?;
        }
        OutputFormat::Ndjson => {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut *out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        OutputFormat::Markdown => {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            writeln!(out, "| {} |", names.join(" | "))?;
            writeln!(
                out,
                "|{}|",
                names.iter().map(|_| "---").collect::<Vec<_>>().join("|")
            )?;
            for column_cells in rows_of(&cells(schema, batches)?) {
                let cells: Vec<String> =
                    column_cells.iter().map(|c| c.replace('|', "\\|")).collect();
                writeln!(out, "| {} |", cells.join(" | "))?;
            }
        }
    }
    Ok(())
}

/// Every column's cells as text (NULL for nulls), in row order.
fn cells(schema: &SchemaRef, batches: &[RecordBatch]) -> anyhow::Result<Vec<Vec<String>>> {
    let opts = FormatOptions::default().with_null("NULL");
    let mut columns = vec![Vec::new(); schema.fields().len()];
    for b in batches {
        for (column, array) in columns.iter_mut().zip(b.columns()) {
            let f = ArrayFormatter::try_new(array.as_ref(), &opts)?;
            column.extend((0..b.num_rows()).map(|r| f.value(r).to_string()));
        }
    }
    Ok(columns)
}

/// Rows from columns of cells.
fn rows_of(columns: &[Vec<String>]) -> Vec<Vec<&String>> {
    let n = columns.first().map_or(0, Vec::len);
    (0..n)
        .map(|r| columns.iter().map(|c| &c[r]).collect())
        .collect()
}

fn is_text(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, v) => is_text(v),
        _ => false,
    }
}

fn write_table(
    out: &mut dyn Write,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    layout: Layout,
) -> anyhow::Result<()> {
    if schema.fields().is_empty() {
        return Ok(());
    }
    let mut columns = cells(schema, batches)?;
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let widths: Vec<usize> = names
        .iter()
        .zip(&columns)
        .map(|(n, c)| {
            c.iter()
                .map(|v| fit::width(v))
                .fold(fit::width(n), usize::max)
        })
        .collect();
    if layout.expanded == Expanded::On {
        return write_expanded(out, &names, &columns, None);
    }
    let headers: Vec<usize> = names.iter().map(|n| fit::width(n)).collect();
    let text: Vec<bool> = schema
        .fields()
        .iter()
        .map(|f| is_text(f.data_type()))
        .collect();
    let caps = fit::column_caps(&widths, &headers, &text, layout.width);
    let fitted = fit::table_width(&fit::capped_widths(&widths, &caps));
    if layout.expanded == Expanded::Auto && fitted > layout.width {
        return write_expanded(out, &names, &columns, Some(layout.width));
    }
    for (column, &cap) in columns.iter_mut().zip(&caps) {
        if cap != usize::MAX {
            *column = fit::shorten_column(column, cap);
        }
    }
    write_grid(out, &names, &columns)?;
    Ok(())
}

/// The table as arrow's `pretty` (comfy-table) draws it: `+---+` borders, one space of padding,
/// left-aligned, a cell with line breaks over several lines. Written directly, because
/// comfy-table took 0.15 s of the 0.35 s `gpuq runs` needs for 10,000 runs.
fn write_grid(out: &mut dyn Write, names: &[&str], columns: &[Vec<String>]) -> std::io::Result<()> {
    let widths: Vec<usize> = names
        .iter()
        .zip(columns)
        .map(|(name, column)| {
            std::iter::once(*name)
                .chain(column.iter().map(String::as_str))
                .flat_map(|cell| cell.split('\n'))
                .map(fit::width)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut border = String::from("+");
    for w in &widths {
        border.extend(std::iter::repeat_n('-', w + 2));
        border.push('+');
    }
    fn row<'a>(text: &mut String, widths: &[usize], cells: impl Iterator<Item = &'a str>) {
        let lines: Vec<Vec<&str>> = cells.map(|c| c.split('\n').collect()).collect();
        let height = lines.iter().map(Vec::len).max().unwrap_or(1);
        for k in 0..height {
            text.push('|');
            for (cell, &w) in lines.iter().zip(widths) {
                let part = cell.get(k).copied().unwrap_or("");
                text.push(' ');
                text.push_str(part);
                text.extend(std::iter::repeat_n(' ', w - fit::width(part) + 1));
                text.push('|');
            }
            text.push('\n');
        }
    }
    border.push('\n');
    let mut text = border.clone();
    row(&mut text, &widths, names.iter().copied());
    text.push_str(&border);
    for r in 0..columns.first().map_or(0, Vec::len) {
        row(&mut text, &widths, columns.iter().map(|c| c[r].as_str()));
    }
    text.push_str(&border);
    out.write_all(text.as_bytes())
}

/// psql's expanded display: a `-[ RECORD n ]` line, then `column | value` per column. With a
/// `width`, longer values are shortened (distinct ones kept distinct) so that lines fit it.
fn write_expanded(
    out: &mut dyn Write,
    names: &[&str],
    columns: &[Vec<String>],
    width: Option<usize>,
) -> anyhow::Result<()> {
    let name_width = names.iter().map(|n| fit::width(n)).max().unwrap_or(0);
    let shortened: Vec<Vec<String>>;
    let columns = match width {
        Some(w) => {
            let cap = w.saturating_sub(name_width + 3).max(fit::MIN_TEXT_WIDTH);
            shortened = columns
                .iter()
                .map(|c| fit::shorten_column(c, cap))
                .collect();
            &shortened
        }
        None => columns,
    };
    let rows = rows_of(columns);
    if rows.is_empty() {
        writeln!(out, "(0 rows)")?;
    }
    for (i, row) in rows.iter().enumerate() {
        writeln!(
            out,
            "-[ RECORD {} ]{}",
            i + 1,
            "-".repeat(name_width.max(8))
        )?;
        for (name, value) in names.iter().zip(row) {
            writeln!(out, "{name:<name_width$} | {value}")?;
        }
    }
    Ok(())
}

fn is_nested(t: &DataType) -> bool {
    t.is_nested() || matches!(t, DataType::Union(..))
}

/// `schema` with its nested columns as text.
fn flat_schema(schema: &SchemaRef) -> SchemaRef {
    if !schema.fields().iter().any(|f| is_nested(f.data_type())) {
        return schema.clone();
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            if is_nested(f.data_type()) {
                Field::new(f.name(), DataType::Utf8, true)
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// `batch` with each nested column replaced by the JSON text of its values.
fn flatten_nested(batch: &RecordBatch, flat: &SchemaRef) -> anyhow::Result<RecordBatch> {
    if batch.schema().as_ref() == flat.as_ref() {
        return Ok(batch.clone());
    }
    let columns = batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, c)| {
            if is_nested(f.data_type()) {
                json_text(f, c.as_ref())
            } else {
                Ok(c.clone())
            }
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(flat.clone(), columns)?)
}

/// The JSON text of every value of `array` (NULL stays NULL).
fn json_text(field: &FieldRef, array: &dyn Array) -> anyhow::Result<ArrayRef> {
    let options = EncoderOptions::default().with_explicit_nulls(true);
    let mut encoder = make_encoder(field, array, &options)?;
    let mut text = StringBuilder::new();
    let mut buf = Vec::new();
    for i in 0..array.len() {
        if array.is_null(i) {
            text.append_null();
        } else {
            buf.clear();
            encoder.encode(i, &mut buf);
            text.append_value(std::str::from_utf8(&buf)?);
        }
    }
    Ok(Arc::new(text.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, MapBuilder, StringArray};

    /// The grid is drawn as arrow's `pretty` (comfy-table) draws the same cells.
    #[test]
    fn the_grid_is_the_one_arrow_pretty_draws() {
        let a: ArrayRef = Arc::new(StringArray::from(vec![
            Some("x\nyy"),
            Some("zzz"),
            Some("é✓"),
            Some(""),
            Some("漢字 🙂"),
        ]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["2", "3", "", "long value", "x"]));
        let batch = RecordBatch::try_from_iter([("a", a), ("bee", b)]).unwrap();
        let columns = cells(&batch.schema(), std::slice::from_ref(&batch)).unwrap();
        let mut ours = Vec::new();
        write_grid(&mut ours, &["a", "bee"], &columns).unwrap();
        let theirs = datafusion::arrow::util::pretty::pretty_format_batches(&[batch]).unwrap();
        assert_eq!(String::from_utf8(ours).unwrap(), format!("{theirs}\n"));
        let empty = RecordBatch::try_from_iter([(
            "only",
            Arc::new(StringArray::from(Vec::<&str>::new())) as ArrayRef,
        )])
        .unwrap();
        let mut ours = Vec::new();
        write_grid(&mut ours, &["only"], &[Vec::new()]).unwrap();
        let theirs = datafusion::arrow::util::pretty::pretty_format_batches(&[empty]).unwrap();
        assert_eq!(String::from_utf8(ours).unwrap(), format!("{theirs}\n"));
    }

    fn render(batch: &RecordBatch, format: OutputFormat, layout: Layout) -> String {
        let mut out = Vec::new();
        write_batches_with(&mut out, format, &batch.schema(), &[batch.clone()], layout).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn tags_batch() -> RecordBatch {
        let mut tags = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        tags.keys().append_value("model");
        tags.values().append_value("llama, 8B");
        tags.keys().append_value("bs");
        tags.values().append_value("8");
        tags.append(true).unwrap();
        tags.append(true).unwrap();
        let tags: ArrayRef = Arc::new(tags.finish());
        let run: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
        RecordBatch::try_from_iter([("run", run), ("tags", tags)]).unwrap()
    }

    #[test]
    fn csv_prints_nested_columns_as_json_text() {
        let text = render(&tags_batch(), OutputFormat::Csv, Layout::terminal());
        assert_eq!(
            text,
            "run,tags\na,\"{\"\"model\"\":\"\"llama, 8B\"\",\"\"bs\"\":\"\"8\"\"}\"\nb,{}\n"
        );
    }

    #[test]
    fn tables_fit_the_width_and_expanded_shows_one_column_per_line() {
        let long = format!("void at::native::kernel<{}>(int)", "x".repeat(300));
        let name: ArrayRef = Arc::new(StringArray::from(vec![long.clone(), "short".into()]));
        let n: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        let batch = RecordBatch::try_from_iter([("name", name), ("n", n)]).unwrap();
        let narrow = Layout {
            expanded: Expanded::Off,
            width: 60,
        };
        let table = render(&batch, OutputFormat::Table, narrow);
        assert!(table.lines().all(|l| fit::width(l) <= 60), "{table}");
        assert!(
            table.contains("kernel<xx") && table.contains('…'),
            "{table}"
        );
        let wide = Layout {
            expanded: Expanded::Off,
            width: 1000,
        };
        assert!(render(&batch, OutputFormat::Table, wide).contains(&long));
        // Expanded: full values, one `column | value` line each.
        let x = render(
            &batch,
            OutputFormat::Table,
            Layout {
                expanded: Expanded::On,
                width: 60,
            },
        );
        assert!(x.starts_with("-[ RECORD 1 ]"), "{x}");
        assert!(x.contains(&format!("name | {long}\n")), "{x}");
        assert!(x.contains("n    | 2\n"), "{x}");
        // Auto: a table while shortened names make it fit; expanded, with values shortened
        // to the width, when it cannot fit even so.
        let auto = |batch: &RecordBatch, width| {
            render(
                batch,
                OutputFormat::Table,
                Layout {
                    expanded: Expanded::Auto,
                    width,
                },
            )
        };
        assert!(auto(&batch, 60).starts_with("+-"));
        assert!(auto(&batch, 1000).starts_with("+-"));
        let many: Vec<(String, ArrayRef)> = (0..8)
            .map(|i| {
                let c: ArrayRef = Arc::new(Int64Array::from(vec![123_456_789, i]));
                (format!("column_{i}"), c)
            })
            .chain([("name".to_string(), batch.column(0).clone())])
            .collect();
        let wide = RecordBatch::try_from_iter(many).unwrap();
        let x = auto(&wide, 60);
        assert!(x.starts_with("-[ RECORD 1 ]"), "{x}");
        assert!(x.lines().all(|l| fit::width(l) <= 60), "{x}");
        assert!(x.contains("column_0 | 123456789\n"), "{x}");
        // Other formats keep full values.
        assert!(render(&batch, OutputFormat::Csv, narrow).contains(&long));
    }
}
