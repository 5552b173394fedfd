//! `demangle(name)` and `short_name(name)`: readable C++ kernel names.

use datafusion::logical_expr::{Documentation, Signature};
use std::borrow::Cow;
use std::sync::LazyLock;

/// Demangles an Itanium C++ symbol (`_Z...`) with `cpp_demangle`; anything else — already
/// demangled names, Triton/cuBLAS kernel names, strings that fail to demangle — is returned
/// unchanged.
pub fn demangle(name: &str) -> Cow<'_, str> {
    if !(name.starts_with("_Z") || name.starts_with("__Z")) {
        return Cow::Borrowed(name);
    }
    match cpp_demangle::Symbol::new(name.as_bytes()) {
        Ok(sym) => match sym.demangle(&cpp_demangle::DemangleOptions::default()) {
            Ok(s) => Cow::Owned(s),
            Err(_) => Cow::Borrowed(name),
        },
        Err(_) => Cow::Borrowed(name),
    }
}

/// The base function name of a (possibly mangled) kernel name: demangles, then drops the return
/// type, the namespaces/classes, the template arguments and the parameter list, e.g.
/// `void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>(int, ...)`
/// → `vectorized_elementwise_kernel`. Brackets are matched with a stack (`<` `(` `[`), so
/// `(anonymous namespace)`, `<unnamed>`, lambdas and comparisons such as `(8)>(0)` inside template
/// arguments are handled. Names that are not C++ signatures (no `::`, `<` or `(` directly after
/// an identifier, e.g. `Memcpy HtoD (Pageable -> Device)` or Triton names) come back unchanged
/// (trimmed).
pub fn short_name(name: &str) -> String {
    let full = demangle(name);
    let s = full.trim();
    // Depth-0 text (template arguments removed) up to the parameter list.
    let mut top = String::with_capacity(s.len());
    let mut stack: Vec<char> = Vec::new();
    let mut prev = ' ';
    let mut iter = s.char_indices().peekable();
    while let Some((i, c)) = iter.next() {
        match c {
            '(' if stack.is_empty() => {
                if s[i..].starts_with("(anonymous namespace)") {
                    stack.push('(');
                } else if prev == ' ' || top.is_empty() {
                    // `Memcpy HtoD (Pageable -> Device)`: not a C++ signature.
                    return s.to_string();
                } else if top.ends_with("operator") {
                    top.push_str("()");
                    // skip the matching ')' of `operator()`
                    if let Some((_, ')')) = iter.peek() {
                        iter.next();
                    }
                } else {
                    break; // parameter list
                }
            }
            '<' | '(' | '[' => {
                if c == '<' && stack.is_empty() && top.ends_with("operator") {
                    top.push(c);
                } else {
                    stack.push(c);
                }
            }
            '>' => {
                if stack.last() == Some(&'<') {
                    stack.pop();
                } else if stack.is_empty() {
                    top.push(c);
                }
            }
            ')' => {
                if stack.last() == Some(&'(') {
                    stack.pop();
                }
            }
            ']' => {
                if stack.last() == Some(&'[') {
                    stack.pop();
                }
            }
            _ if stack.is_empty() => top.push(c),
            _ => {}
        }
        prev = c;
    }
    // Drop the return type (text up to the last depth-0 space), then the qualifiers.
    let top = top.trim();
    let last = top.rsplit(' ').next().unwrap_or(top);
    let base = last.rsplit("::").next().unwrap_or(last);
    if base.is_empty() {
        s.to_string()
    } else {
        base.to_string()
    }
}

/// `demangle(name) -> Utf8`: see [`demangle`].
///
/// ```sql
/// SELECT demangle('_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib');
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Demangle {
    signature: Signature,
}

/// `short_name(name) -> Utf8`: see [`short_name`].
///
/// ```sql
/// SELECT short_name(name), count(*) FROM kernels GROUP BY 1 ORDER BY 2 DESC;
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ShortName {
    signature: Signature,
}

static DEMANGLE_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Demangles an Itanium C++ symbol (_Z...); other strings are returned unchanged.",
        "demangle(name)",
    )
    .with_sql_example("SELECT demangle('_ZN2at6native4testEv'); -- 'at::native::test()'")
    .with_argument("name", "a kernel or function name")
    .build()
});

static SHORT_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Base function name of a kernel: demangled, without return type, namespaces, template \
         arguments and parameter list. Names that are not C++ signatures are returned unchanged.",
        "short_name(name)",
    )
    .with_sql_example(
        "SELECT short_name('void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)'); \
         -- 'vectorized_elementwise_kernel'",
    )
    .with_argument("name", "a kernel or function name")
    .build()
});

/// A scalar function of one text argument, `$f` applied to each distinct string.
macro_rules! text_udf {
    ($ty:ident, $name:literal, $doc:ident, $f:expr) => {
        super::scalar_udf!(
            $ty,
            $name,
            $doc,
            super::coerce_text_arg,
            datafusion::arrow::datatypes::DataType::Utf8,
            |args: datafusion::logical_expr::ScalarFunctionArgs| {
                super::map_text(&args.args[0], args.number_rows, $f)
            }
        );
    };
}
pub(crate) use text_udf;

text_udf!(Demangle, "demangle", DEMANGLE_DOC, |s| Ok(
    demangle(s).into_owned()
));
text_udf!(ShortName, "short_name", SHORT_DOC, |s| Ok(short_name(s)));
