//! Printing query results: table, CSV, JSON, NDJSON, Markdown.

use crate::args::OutputFormat;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::arrow::util::pretty::pretty_format_batches_with_options;
use std::io::Write;

pub fn write_batches(
    out: &mut dyn Write,
    format: OutputFormat,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> anyhow::Result<()> {
    match format {
        OutputFormat::Table => {
            if schema.fields().is_empty() {
                return Ok(());
            }
            let batches: Vec<RecordBatch> = if batches.is_empty() {
                vec![RecordBatch::new_empty(schema.clone())]
            } else {
                batches.to_vec()
            };
            let opts = FormatOptions::default().with_null("NULL");
            writeln!(
                out,
                "{}",
                pretty_format_batches_with_options(&batches, &opts)?
            )?;
        }
        OutputFormat::Csv => {
            let mut w = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut *out);
            if batches.is_empty() {
                w.write(&RecordBatch::new_empty(schema.clone()))?;
            }
            for b in batches {
                w.write(b)?;
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
            let opts = FormatOptions::default().with_null("NULL");
            for b in batches {
                let fmts = b
                    .columns()
                    .iter()
                    .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
                    .collect::<Result<Vec<_>, _>>()?;
                for row in 0..b.num_rows() {
                    let cells: Vec<String> = fmts
                        .iter()
                        .map(|f| f.value(row).to_string().replace('|', "\\|"))
                        .collect();
                    writeln!(out, "| {} |", cells.join(" | "))?;
                }
            }
        }
    }
    Ok(())
}
