//! The Nsight Systems adapter on generated and real exports.

use super::*;

#[test]
fn api_names_drop_a_four_digit_version_suffix_only() {
    assert_eq!(
        api_display_name("cudaLaunchKernel_v7000"),
        "cudaLaunchKernel"
    );
    assert_eq!(api_display_name("cudaMemcpyAsync_v3020"), "cudaMemcpyAsync");
    assert_eq!(
        api_display_name("cudaLaunchKernelExC_v11060"),
        "cudaLaunchKernelExC_v11060"
    );
    assert_eq!(
        api_display_name("cudaGetDeviceProperties_v2_v12000"),
        "cudaGetDeviceProperties_v2_v12000"
    );
    assert_eq!(api_display_name("cuLaunchKernel"), "cuLaunchKernel");
    assert_eq!(api_display_name("_v1234"), "_v1234");
}

#[test]
fn a_value_of_the_wrong_type_is_an_error_at_its_table_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.sqlite");
    gpuq_synth::write_nsys(&gpuq_synth::NsysConfig::small(), &path).unwrap();
    let row: i64 = {
        let c = Connection::open(&path).unwrap();
        let row = c
            .query_row(
                "SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid LIMIT 1 OFFSET 5",
                [],
                |r| r.get(0),
            )
            .unwrap();
        c.execute(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 'gpu0' WHERE rowid = ?1",
            [row],
        )
        .unwrap();
        row
    };
    let mut sink = |_| Ok(());
    let export = Export::open(&path, &NsysOptions::default()).unwrap();
    let (_, gpu) = export.read_host(&|_| {}, &mut sink).unwrap();
    let err = gpu.read(&|_| {}, &|_| Ok(())).unwrap_err().unwrap();
    assert_eq!(
        err.at,
        crate::formats::Position::Row {
            table: "CUPTI_ACTIVITY_KIND_KERNEL".into(),
            row
        }
    );
    assert!(err.message.contains("column 3"), "{}", err.message);
}

/// Every row an export's tables give, as sorted text lines.
fn all_rows(path: &Path, read_pages: bool) -> Vec<String> {
    let opts = NsysOptions {
        read_pages,
        ..Default::default()
    };
    let export = Export::open(path, &opts).unwrap();
    assert_eq!(export.ctx.pages.is_some(), read_pages, "{}", path.display());
    let planned = export.host_tasks.iter().chain(&export.gpu_tasks);
    assert!(planned.clone().all(|t| t.plan.is_some() == read_pages));
    let batches = Mutex::new(Vec::new());
    let mut sink = |b| {
        batches.lock().unwrap().push(b);
        Ok(())
    };
    let (_, gpu) = export.read_host(&|_| {}, &mut sink).unwrap();
    gpu.read(&|_| {}, &|b| {
        batches.lock().unwrap().push(b);
        Ok(())
    })
    .unwrap();
    let batches = batches.into_inner().unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap();
    let mut lines: Vec<String> = text.to_string().lines().map(str::to_string).collect();
    lines.sort_unstable();
    lines
}

#[test]
fn tables_read_from_pages_give_the_rows_sqlite_gives() {
    let dir = tempfile::tempdir().unwrap();
    let generated = dir.path().join("report.sqlite");
    gpuq_synth::write_nsys(&gpuq_synth::NsysConfig::small(), &generated).unwrap();
    let mut exports = vec![generated];
    if let Some(shared) = gpuq_testkit::shared_traces("nsys") {
        exports.extend(
            std::fs::read_dir(&shared)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "sqlite")),
        );
    }
    for path in exports {
        let (pages, sqlite) = (all_rows(&path, true), all_rows(&path, false));
        assert!(
            pages.len() > 10,
            "{}: {} lines",
            path.display(),
            pages.len()
        );
        assert!(pages == sqlite, "{}: rows differ", path.display());
    }
}

#[test]
fn operator_ranges_are_recognised() {
    assert_eq!(
        operator_name("aten::mm, seq = 3, sizes = [[2, 3]]"),
        Some("aten::mm")
    );
    assert_eq!(operator_name("aten::add_"), Some("aten::add_"));
    assert_eq!(operator_name("forward"), None);
    assert_eq!(operator_name("ProfilerStep#3"), None);
    assert_eq!(operator_name("a b::c"), None);
}

#[test]
fn default_step_pattern_covers_the_usual_forms() {
    let re = NsysOptions::default().step_pattern;
    let step = |s: &str| {
        re.captures(s)
            .and_then(|c| c.get(1))
            .map(|m| m.as_str().parse::<i64>().unwrap())
    };
    assert_eq!(step("ProfilerStep#12"), Some(12));
    assert_eq!(step("step 12"), Some(12));
    assert_eq!(step("Step_7"), Some(7));
    assert_eq!(step("iteration_12"), Some(12));
    assert_eq!(step("train_step[12]"), Some(12));
    assert_eq!(step("iter 3"), Some(3));
    assert_eq!(step("forward"), None);
    assert_eq!(step("aten::mm"), None);
    assert!(step_pattern("(\\d+)").is_ok());
    assert!(step_pattern("denoise_step").is_ok());
    assert!(step_pattern("(a)(\\d+)").is_err());
    assert!(step_pattern("(").is_err());
}
