//! Fitting a table to the terminal: the terminal's width, and shortening long text cells
//! (800-character C++ kernel names) so that distinct values stay distinct.

use std::collections::HashMap;
use std::io::IsTerminal;

/// The width a table is fitted to when standard output is not a terminal and `COLUMNS` is
/// not set: wide enough for a pager or a file, narrow enough that a kernel name does not
/// make a 1100-column table.
pub const DEFAULT_WIDTH: usize = 160;

/// Text columns are never shortened below this many characters (nor below their header):
/// enough for a kernel's base name and the place where it differs from the others. A table
/// that does not fit even so is shown expanded where the layout allows it
/// ([`crate::output::Expanded::Auto`]).
pub const MIN_TEXT_WIDTH: usize = 16;

const ELLIPSIS: char = '…';

/// The width to fit tables to: `COLUMNS` when set, the terminal's width when standard output
/// is one, [`DEFAULT_WIDTH`] otherwise.
pub fn terminal_width() -> usize {
    if let Some(n) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n;
    }
    if std::io::stdout().is_terminal() {
        if let Some(n) = tty_columns() {
            return n;
        }
    }
    DEFAULT_WIDTH
}

#[cfg(unix)]
fn tty_columns() -> Option<usize> {
    // SAFETY: TIOCGWINSZ fills a winsize struct we own; fd 1 stays open for the call.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some(size.ws_col as usize)
}

#[cfg(not(unix))]
fn tty_columns() -> Option<usize> {
    None
}

/// Display width of a cell: the terminal columns it takes (a CJK character or an emoji two),
/// as comfy-table measured it when it drew gpuq's tables.
pub fn width(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// The width of a pretty table whose columns are `widths` characters wide: 3 characters per
/// column (`| ` and ` `) and the closing `|`.
pub fn table_width(widths: &[usize]) -> usize {
    widths.iter().map(|w| w + 3).sum::<usize>() + 1
}

/// The widest a text column may be so that the whole table fits `total` characters.
/// `widths` are the columns' natural widths (header included), `headers` their headers'
/// widths, and `text` says which may be shortened. One cap applies to every text column, so
/// the widest give up characters first; the cap is the largest that fits, and never below
/// [`MIN_TEXT_WIDTH`] or a column's header. Returns one cap per column (`usize::MAX` for
/// columns left alone); [`capped_widths`] tells whether the table then fits.
pub fn column_caps(widths: &[usize], headers: &[usize], text: &[bool], total: usize) -> Vec<usize> {
    let mut caps = vec![usize::MAX; widths.len()];
    if table_width(widths) <= total {
        return caps;
    }
    let shrinkable: Vec<usize> = (0..widths.len()).filter(|&i| text[i]).collect();
    let Some(widest) = shrinkable.iter().map(|&i| widths[i]).max() else {
        return caps;
    };
    let width_at = |c: usize| {
        let mut ws = widths.to_vec();
        for &i in &shrinkable {
            ws[i] = widths[i].min(c.max(headers[i]));
        }
        table_width(&ws)
    };
    // The largest cap c with a table of at most `total` characters (the width grows with c).
    let mut cap = MIN_TEXT_WIDTH;
    let (mut lo, mut hi) = (MIN_TEXT_WIDTH, widest);
    while lo <= hi {
        let mid = (lo + hi) / 2;
        if width_at(mid) <= total {
            cap = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    for i in shrinkable {
        let c = cap.max(headers[i]);
        if widths[i] > c {
            caps[i] = c;
        }
    }
    caps
}

/// The columns' widths once capped by [`column_caps`].
pub fn capped_widths(widths: &[usize], caps: &[usize]) -> Vec<usize> {
    widths.iter().zip(caps).map(|(&w, &c)| w.min(c)).collect()
}

/// Shortens every value of a column to at most `cap` characters, keeping distinct values
/// distinct. First the noise of C++ signatures goes (`void `, namespace qualifiers, the
/// kernel's parameter list); what is still too long keeps its head and tail around `…`.
/// Values that would then collide show, after their common beginning, the place where they
/// differ; the last resort is a `~N` suffix numbering the colliding values.
pub fn shorten_column(values: &[String], cap: usize) -> Vec<String> {
    let mut out: Vec<String> = values.iter().map(|v| shorten(v, cap)).collect();
    // Short form -> the distinct originals that produced it.
    let mut groups: HashMap<String, Vec<&str>> = HashMap::new();
    for (short, orig) in out.iter().zip(values) {
        let g = groups.entry(short.clone()).or_default();
        if !g.contains(&orig.as_str()) {
            g.push(orig);
        }
    }
    let mut renamed: HashMap<&str, String> = HashMap::new();
    for originals in groups.values().filter(|g| g.len() > 1) {
        let simple: Vec<String> = originals.iter().map(|o| simplify(o)).collect();
        let mut shown = distinguish(&simple, cap, &[]);
        // The last resort for what still collides: number the colliding values.
        let mut seen: HashMap<String, usize> = HashMap::new();
        for s in &shown {
            *seen.entry(s.clone()).or_default() += 1;
        }
        let mut k = 0;
        for s in shown.iter_mut() {
            if seen[s.as_str()] > 1 {
                k += 1;
                let tag = format!("~{k}");
                *s = format!("{}{tag}", truncate(s, cap.saturating_sub(tag.len())));
            }
        }
        for (o, s) in originals.iter().zip(shown) {
            renamed.insert(o, s);
        }
    }
    for (short, orig) in out.iter_mut().zip(values) {
        if let Some(s) = renamed.get(orig.as_str()) {
            *short = s.clone();
        }
    }
    out
}

/// Distinct simplified values shown from where they start to differ; values that still look
/// alike are shown, in addition, from where they differ among themselves (a few levels deep).
/// `points` are the places shown already.
fn distinguish(simple: &[String], cap: usize, points: &[usize]) -> Vec<String> {
    let mut points = points.to_vec();
    points.push(common_prefix(simple));
    let mut shown: Vec<String> = simple.iter().map(|s| windows(s, &points, cap)).collect();
    if points.len() >= 3 {
        return shown;
    }
    let mut alike: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, s) in shown.iter().enumerate() {
        alike.entry(s.clone()).or_default().push(i);
    }
    for members in alike.into_values().filter(|m| m.len() > 1) {
        let subset: Vec<String> = members.iter().map(|&i| simple[i].clone()).collect();
        if common_prefix(&subset) > points[points.len() - 1] {
            for (&i, s) in members.iter().zip(distinguish(&subset, cap, &points)) {
                shown[i] = s;
            }
        }
    }
    shown
}

/// One value shortened to `cap` characters (without regard to other values).
pub fn shorten(value: &str, cap: usize) -> String {
    if width(value) <= cap {
        return value.to_string();
    }
    let simple = simplify(value);
    if width(&simple) <= cap {
        return simple;
    }
    middle_ellipsis(&simple, cap)
}

/// A C++ signature without what rarely tells kernels apart: a leading `void `, namespace and
/// class qualifiers (`at::native::`), and the parameter list after the name's template
/// arguments; whitespace runs become one space. Other text comes back unchanged.
pub fn simplify(value: &str) -> String {
    let s = value.trim();
    let s = s.strip_prefix("void ").unwrap_or(s);
    let s = drop_parameter_list(s);
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("(anonymous namespace)::") {
            rest = after;
            continue;
        }
        // An identifier followed by `::` is a qualifier, unless it is the last component.
        let ident_len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if ident_len > 0 && rest[ident_len..].starts_with("::") {
            let after = &rest[ident_len + 2..];
            if after.starts_with(|c: char| c.is_alphabetic() || c == '_' || c == '~')
                || after.starts_with("(anonymous namespace)::")
            {
                rest = after;
                continue;
            }
        }
        let step = if ident_len > 0 {
            ident_len
        } else {
            rest.chars().next().map_or(1, char::len_utf8)
        };
        out.push_str(&rest[..step]);
        rest = &rest[step..];
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `name<...>(int, float*)` -> `name<...>`: drops a trailing balanced parenthesised list that
/// follows an identifier or `>` directly (a parameter list). `Memcpy HtoD (Pageable -> Device)`
/// keeps its parenthesis: a space comes before it.
fn drop_parameter_list(s: &str) -> &str {
    if !s.ends_with(')') {
        return s;
    }
    let mut depth = 0i32;
    for (i, c) in s.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    let before = s[..i].trim_end();
                    // Only a call-like list: right after an identifier or template arguments.
                    let call_like = before
                        .chars()
                        .last()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '>');
                    let spaced = s[..i].ends_with(' ');
                    return if call_like && !spaced && i > 0 {
                        before
                    } else {
                        s
                    };
                }
            }
            _ => {}
        }
    }
    s
}

/// The first `head` and last characters of `s` around `…`, `cap` characters in all.
fn middle_ellipsis(s: &str, cap: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= cap {
        return s.to_string();
    }
    if cap <= 1 {
        return ELLIPSIS.to_string();
    }
    let tail = (cap - 1) / 3;
    let head = cap - 1 - tail;
    let mut out: String = chars[..head].iter().collect();
    out.push(ELLIPSIS);
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// `s` as its first characters and a window from a little before each of `points` (places,
/// in characters, where it differs from similar values), joined by `…`; `cap` characters in all.
fn windows(s: &str, points: &[usize], cap: usize) -> String {
    const CONTEXT: usize = 2;
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= cap || points.is_empty() {
        return s.to_string();
    }
    let k = points.len();
    let head = (cap / 5).min(points[0]);
    // One `…` before each window and one at the end.
    let each = (cap.saturating_sub(head + 2 * k) / k).max(1);
    let mut out: String = chars[..head].iter().collect();
    let mut shown_to = head;
    for &p in points {
        let from = p.saturating_sub(CONTEXT).max(shown_to).min(chars.len());
        if from > shown_to {
            out.push(ELLIPSIS);
        }
        let to = (from + each).min(chars.len());
        out.extend(&chars[from..to]);
        shown_to = to;
    }
    if shown_to < chars.len() {
        out.push(ELLIPSIS);
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Length in characters of the longest common prefix of `values`.
fn common_prefix(values: &[String]) -> usize {
    let Some(first) = values.first() else {
        return 0;
    };
    let first: Vec<char> = first.chars().collect();
    values[1..].iter().fold(first.len(), |n, v| {
        v.chars()
            .zip(&first)
            .take(n)
            .take_while(|(a, b)| a == *b)
            .count()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADD: &str = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1})";
    const MUL: &str = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})";

    #[test]
    fn simplify_drops_qualifiers_return_type_and_parameters() {
        assert_eq!(
            simplify(ADD),
            "elementwise_kernel<128, 2, gpu_kernel_impl_nocast<CUDAFunctor_add<float> >(TensorIteratorBase&, CUDAFunctor_add<float> const&)::{lambda(int)#1}>"
        );
        // Not a signature: unchanged.
        assert_eq!(
            simplify("Memcpy HtoD (Pageable -> Device)"),
            "Memcpy HtoD (Pageable -> Device)"
        );
        assert_eq!(
            simplify(
                "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
            ),
            "ncclKernel_AllReduce_RING_LL_Sum_float"
        );
        assert_eq!(simplify("flash_fwd_kernel"), "flash_fwd_kernel");
    }

    #[test]
    fn short_values_are_kept_and_long_ones_fit_the_cap() {
        assert_eq!(shorten("gemm_relu", 24), "gemm_relu");
        for cap in [24, 40, 60, 100] {
            for v in [ADD, MUL] {
                let s = shorten(v, cap);
                assert!(width(&s) <= cap, "{cap}: {s}");
                assert!(s.starts_with("elementwise_kern"), "{s}");
            }
        }
    }

    #[test]
    fn distinct_names_stay_distinct() {
        // The same long prefix, differing only deep inside: a head/tail cut alone collides.
        let base = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<";
        let tail = ">, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)";
        let values: Vec<String> = ["float", "double", "c10::Half", "int"]
            .iter()
            .map(|t| format!("{base}{t}{}", tail))
            .chain([ADD.to_string(), MUL.to_string(), ADD.to_string()])
            .collect();
        for cap in [24, 30, 50] {
            let short = shorten_column(&values, cap);
            assert!(short.iter().all(|s| width(s) <= cap), "{short:?}");
            // Equal originals -> equal short forms; distinct originals -> distinct ones.
            assert_eq!(short[4], short[6]);
            let mut uniq = short[..6].to_vec();
            uniq.sort();
            uniq.dedup();
            assert_eq!(uniq.len(), 6, "{cap}: {short:?}");
        }
        // With room, the differing part is what shows.
        let short = shorten_column(&values, 50);
        assert!(short[1].contains("double"), "{short:?}");
        // Names that differ in two places (layout, then tile size) are told apart without
        // falling back to numbers.
        let gemms: Vec<String> = ["tn", "nt"]
            .iter()
            .flat_map(|l| {
                ["128x128x64", "64x256x64", "256x128x64"].iter().map(move |t| {
                    format!("sm90_xmma_gemm_bf16bf16_bf16f32_f32_{l}_n_tilesize{t}_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas")
                })
            })
            .collect();
        let short = shorten_column(&gemms, 24);
        let mut uniq = short.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), gemms.len(), "{short:?}");
        assert!(
            short.iter().all(|s| !s.contains('~') && width(s) <= 24),
            "{short:?}"
        );
    }

    #[test]
    fn caps_shrink_the_widest_text_columns_to_fit() {
        // 3 columns: a number (10), a long name (800), a short text (20); total width 100.
        let headers = [4, 4, 4];
        let caps = column_caps(&[10, 800, 20], &headers, &[false, true, true], 100);
        assert_eq!(caps[0], usize::MAX);
        assert_eq!(caps[2], usize::MAX, "short text columns keep their width");
        let table = 10 + 3 + caps[1] + 3 + 20 + 3 + 1;
        assert_eq!(table, 100, "{caps:?}");
        // Fits already: nothing changes.
        assert!(column_caps(&[10, 50], &[4, 4], &[false, true], 100)
            .iter()
            .all(|&c| c == usize::MAX));
        // Several text columns: one cap for all, below 24 where needed, and the table fits.
        let widths = [800, 9, 9, 9, 9, 9, 9, 9, 40, 13];
        let headers = [4, 8, 5, 9, 3, 3, 3, 3, 6, 5];
        let text = [
            true, false, false, false, false, false, false, false, true, true,
        ];
        let caps = column_caps(&widths, &headers, &text, 160);
        assert_eq!(caps[0], 26, "the largest cap that fits: {caps:?}");
        assert_eq!(table_width(&capped_widths(&widths, &caps)), 159);
        let caps = column_caps(&widths, &headers, &text, 140);
        assert!(caps[0] < 24, "{caps:?}");
        assert_eq!(caps[0], caps[8]);
        assert!(table_width(&capped_widths(&widths, &caps)) <= 140);
        // Never below the minimum, nor below a header.
        let caps = column_caps(&[100, 800], &[4, 4], &[false, true], 50);
        assert_eq!(caps[1], MIN_TEXT_WIDTH);
        let caps = column_caps(&[100, 800], &[4, 30], &[false, true], 50);
        assert_eq!(caps[1], 30);
    }
}
