//! `fmt_dur(ns)` (nanoseconds to text) and `dur(text)` (text to nanoseconds).

use datafusion::arrow::array::{Array, AsArray, Int64Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::common::{exec_err, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ScalarFunctionArgs, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use nom::branch::alt;
use nom::bytes::complete::tag_no_case;
use nom::character::complete::{char, digit0, multispace0};
use nom::combinator::{all_consuming, opt, value, verify};
use nom::multi::many1;
use nom::sequence::preceded;
use nom::{IResult, Parser};
use std::sync::{Arc, LazyLock};

const NS_PER_US: i128 = 1_000;
const NS_PER_MS: i128 = 1_000_000;
const NS_PER_S: i128 = 1_000_000_000;
const NS_PER_MIN: i128 = 60 * NS_PER_S;
const NS_PER_H: i128 = 60 * NS_PER_MIN;

/// Display units: (ns per unit, suffix, how many of this unit make the next one).
const UNITS: [(i128, &str, Option<i128>); 6] = [
    (1, "ns", Some(1000)),
    (NS_PER_US, "us", Some(1000)),
    (NS_PER_MS, "ms", Some(1000)),
    (NS_PER_S, "s", Some(60)),
    (NS_PER_MIN, "min", Some(60)),
    (NS_PER_H, "h", None),
];

/// Formats nanoseconds for humans: 3 significant digits in the largest unit of
/// `ns, us, ms, s, min, h` in which the value is at least 1, e.g. `532 ns`, `12.0 us`,
/// `1.23 ms`, `59.9 s`, `1.50 min`, `2.00 h`; values under 1 us are whole nanoseconds, values of
/// 1000 h and more are whole hours. Rounding is half-up on the exact integer value, and a value
/// that rounds up to the next unit is shown in it (`999_960 ns` is `1.00 ms`, not `1000 us`).
/// Negative values get a leading `-`.
pub fn fmt_dur(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = (ns as i128).abs();
    if a < 1000 {
        return format!("{sign}{a} ns");
    }
    let start = UNITS.iter().rposition(|u| a >= u.0).unwrap_or(0);
    for &(div, suffix, limit) in &UNITS[start..] {
        let mut chosen = None;
        for decimals in [2u32, 1, 0] {
            let scale = 10i128.pow(decimals);
            let v = (a * scale * 2 + div) / (2 * div);
            if v < 1000 || decimals == 0 {
                chosen = Some((v, decimals, scale));
                break;
            }
        }
        let (v, decimals, scale) = chosen.expect("decimals 0 always chosen");
        if limit.is_some_and(|l| v >= l * scale) {
            continue;
        }
        return if decimals == 0 {
            format!("{sign}{v} {suffix}")
        } else {
            format!(
                "{sign}{}.{:0w$} {suffix}",
                v / scale,
                v % scale,
                w = decimals as usize
            )
        };
    }
    unreachable!("the last unit has no limit")
}

fn unit(i: &str) -> IResult<&str, i128> {
    alt((
        value(1, tag_no_case("ns")),
        value(NS_PER_US, tag_no_case("us")),
        value(NS_PER_US, tag_no_case("µs")),
        value(NS_PER_US, tag_no_case("μs")),
        value(NS_PER_MS, tag_no_case("ms")),
        value(NS_PER_MIN, tag_no_case("min")),
        value(NS_PER_MIN, tag_no_case("m")),
        value(NS_PER_S, tag_no_case("s")),
        value(NS_PER_H, tag_no_case("h")),
    ))
    .parse(i)
}

/// `digits [. digits]` or `. digits`: (integer digits, fraction digits).
fn number(i: &str) -> IResult<&str, (&str, &str)> {
    verify(
        (digit0, opt(preceded(char('.'), digit0))),
        |(int, frac): &(&str, Option<&str>)| !int.is_empty() || frac.is_some_and(|f| !f.is_empty()),
    )
    .map(|(int, frac)| (int, frac.unwrap_or("")))
    .parse(i)
}

/// One `number unit` component, in nanoseconds (fraction rounded half-up), or None on overflow.
fn component(i: &str) -> IResult<&str, Option<i128>> {
    (preceded(multispace0, number), preceded(multispace0, unit))
        .map(|((int, frac), mult)| {
            let int: i128 = if int.is_empty() { 0 } else { int.parse().ok()? };
            // Digits past 20 cannot change a nanosecond count (mult <= 3.6e12).
            let frac = &frac[..frac.len().min(20)];
            let part = if frac.is_empty() {
                0
            } else {
                let scale = 10i128.pow(frac.len() as u32);
                let f: i128 = frac.parse().ok()?;
                (f * mult * 2 + scale) / (2 * scale)
            };
            int.checked_mul(mult)?.checked_add(part)
        })
        .parse(i)
}

/// Parses a duration: an optional `-`, then one or more `number unit` components, spaces
/// allowed around them, summed (`1h30m`, `1m 30s`, `1.5ms`, `250 us`, `.5s`). Numbers are
/// decimal and parsed exactly (no floating point); units are `ns`, `us`/`µs`, `ms`, `s`,
/// `m`/`min`, `h`, case-insensitive. A fractional nanosecond count is rounded half-up per
/// component. Returns None for anything else or a value outside Int64.
pub fn parse_dur(s: &str) -> Option<i64> {
    let parsed: IResult<&str, (Option<char>, Vec<Option<i128>>)> = all_consuming((
        preceded(multispace0, opt(char('-'))),
        nom::sequence::terminated(many1(component), multispace0),
    ))
    .parse(s);
    let (_, (neg, parts)) = parsed.ok()?;
    let mut total: i128 = 0;
    for p in parts {
        total = total.checked_add(p?)?;
    }
    if neg.is_some() {
        total = -total;
    }
    i64::try_from(total).ok()
}

/// `fmt_dur(ns) -> Utf8`: see [`fmt_dur`] for the rule (3 significant digits, units
/// ns/us/ms/s/min/h). Float arguments (e.g. `avg(dur)`) are rounded to whole nanoseconds.
///
/// ```sql
/// SELECT name, fmt_dur(sum(dur)) FROM kernels GROUP BY name;  -- '1.23 ms'
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FmtDur {
    signature: Signature,
}

impl FmtDur {
    pub fn new() -> Self {
        Self {
            signature: Signature::one_of(
                vec![TypeSignature::Uniform(
                    1,
                    vec![DataType::Int64, DataType::Float64],
                )],
                Volatility::Immutable,
            ),
        }
    }
}

impl Default for FmtDur {
    fn default() -> Self {
        Self::new()
    }
}

static FMT_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Formats nanoseconds with 3 significant digits in the largest unit of ns, us, ms, s, \
         min, h where the value is >= 1 (e.g. '532 ns', '12.0 us', '1.23 ms', '1.50 min'); under \
         1 us whole ns; rounding half-up; NULL stays NULL.",
        "fmt_dur(ns)",
    )
    .with_sql_example("SELECT fmt_dur(1234567); -- '1.23 ms'")
    .with_argument("ns", "a duration in nanoseconds")
    .build()
});

impl ScalarUDFImpl for FmtDur {
    fn name(&self) -> &str {
        "fmt_dur"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = matches!(args.args[0], ColumnarValue::Scalar(_));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let out: StringArray = match arrays[0].data_type() {
            DataType::Float64 => arrays[0]
                .as_primitive::<Float64Type>()
                .iter()
                .map(|v| v.map(|v| fmt_dur(v.round() as i64)))
                .collect(),
            _ => cast(&arrays[0], &DataType::Int64)?
                .as_primitive::<Int64Type>()
                .iter()
                .map(|v| v.map(fmt_dur))
                .collect(),
        };
        finish(scalar, Arc::new(out))
    }

    fn documentation(&self) -> Option<&Documentation> {
        Some(&FMT_DOC)
    }
}

fn finish(scalar: bool, out: Arc<dyn Array>) -> Result<ColumnarValue> {
    if scalar {
        Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
    } else {
        Ok(ColumnarValue::Array(out))
    }
}

/// `dur(text) -> Int64`: parses a duration into nanoseconds, see [`parse_dur`] for the
/// grammar. A string that does not parse is an execution error naming it; NULL stays NULL.
///
/// ```sql
/// SELECT * FROM kernels WHERE dur > dur('1.5ms');
/// SELECT dur('1h30m'), dur('1m 30s'), dur('250 us');
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Dur {
    signature: Signature,
}

impl Dur {
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl Default for Dur {
    fn default() -> Self {
        Self::new()
    }
}

static DUR_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Parses a duration into Int64 nanoseconds: optional '-', then one or more \
         '<decimal> <unit>' parts that are summed; units ns, us/µs, ms, s, m/min, h. \
         Exact decimal arithmetic, fractional ns rounded half-up. Errors on anything else.",
        "dur(text)",
    )
    .with_sql_example("SELECT dur('1.5ms'), dur('1h30m'), dur('1m 30s'); -- 1500000, ...")
    .with_argument("text", "a duration such as '1.5ms', '250 us' or '1h30m'")
    .build()
});

impl ScalarUDFImpl for Dur {
    fn name(&self) -> &str {
        "dur"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::coerce_text_arg("dur", arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = matches!(args.args[0], ColumnarValue::Scalar(_));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let strings = cast(&arrays[0], &DataType::Utf8)?;
        let mut out = Vec::with_capacity(strings.len());
        for s in strings.as_string::<i32>().iter() {
            out.push(match s {
                None => None,
                Some(s) => match parse_dur(s) {
                    Some(v) => Some(v),
                    None => {
                        return exec_err!(
                            "dur: invalid duration '{s}' (expected e.g. '1.5ms', '250 us', \
                             '1h30m'; units ns, us, µs, ms, s, m, min, h)"
                        )
                    }
                },
            });
        }
        finish(scalar, Arc::new(Int64Array::from(out)))
    }

    fn documentation(&self) -> Option<&Documentation> {
        Some(&DUR_DOC)
    }
}
