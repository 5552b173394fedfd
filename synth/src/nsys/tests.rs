//! The Nsight Systems generator's export against its own ground truth.
use super::*;
use rusqlite::OpenFlags;

fn gen(cfg: &NsysConfig) -> (tempfile::TempDir, std::path::PathBuf, NsysTruth) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.sqlite");
    let truth = write_nsys(cfg, &path).unwrap();
    (dir, path, truth)
}

fn open(path: &Path) -> Connection {
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

fn one(c: &Connection, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

fn map2(c: &Connection, sql: &str) -> BTreeMap<String, (u64, i64)> {
    let mut st = c.prepare(sql).unwrap();
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                (r.get::<_, i64>(1)? as u64, r.get(2)?),
            ))
        })
        .unwrap();
    rows.map(|r| r.unwrap()).collect()
}

#[test]
fn kernels_match_truth() {
    let cfg = NsysConfig::small();
    let (_d, path, t) = gen(&cfg);
    let c = open(&path);
    let expect = (cfg.processes * (cfg.steps * cfg.kernels_per_step + 1)) as u64;
    assert_eq!(t.kernels, expect);
    assert_eq!(
        one(&c, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL") as u64,
        t.kernels
    );
    let mut st = c
        .prepare(
            "SELECT s.value, count(*), sum(k.end - k.start), min(k.end - k.start), \
             max(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k \
             JOIN StringIds s ON s.id = k.demangledName GROUP BY 1",
        )
        .unwrap();
    let got: BTreeMap<String, (u64, i64, i64, i64)> = st
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                (r.get::<_, i64>(1)? as u64, r.get(2)?, r.get(3)?, r.get(4)?),
            ))
        })
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got, t.kernel_sum_by_name);
    assert_eq!(got.len(), 9);
    assert!(
        got.keys().any(|k| k.contains(", ")),
        "some names contain commas"
    );
    let short = map2(
        &c,
        "SELECT s.value, count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k \
         JOIN StringIds s ON s.id = k.shortName GROUP BY 1",
    );
    assert_eq!(short, t.kernel_sum_by_short_name);
    assert_eq!(
        short["vectorized_elementwise_kernel"].0,
        (cfg.processes * cfg.steps * 150) as u64
    );
    // Templated kernels have distinct demangled and short names; cuBLAS ones the same id.
    assert!(
        one(
            &c,
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE demangledName <> shortName"
        ) > 0
    );
    assert!(
        one(
            &c,
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE demangledName = shortName"
        ) > 0
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE tensorSizeMinusOneElements <> '[]'"),
        0
    );
    let by_stream: i64 = t.kernels_by_stream.values().map(|v| v.1).sum();
    assert_eq!(
        by_stream,
        one(
            &c,
            "SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL"
        )
    );
}

#[test]
fn schema_is_3_25_0() {
    let (_d, path, _t) = gen(&NsysConfig::small());
    let c = open(&path);
    let cols = |t: &str| -> Vec<String> {
        let mut st = c
            .prepare(&format!("SELECT name FROM pragma_table_info('{t}')"))
            .unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    };
    let k = cols("CUPTI_ACTIVITY_KIND_KERNEL");
    assert_eq!(k.len(), 40);
    assert_eq!(k[4], "greenContextId");
    assert_eq!(k[39], "tensorSizeMinusOneElements");
    assert_eq!(cols("CUPTI_ACTIVITY_KIND_MEMCPY").len(), 21);
    assert_eq!(cols("CUPTI_ACTIVITY_KIND_MEMSET").len(), 12);
    assert_eq!(cols("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION").len(), 12);
    assert_eq!(cols("CUPTI_ACTIVITY_KIND_RUNTIME").len(), 8);
    assert_eq!(cols("NVTX_EVENTS").len(), 20);
    assert_eq!(cols("TARGET_INFO_GPU").len(), 41);
    assert_eq!(cols("PROFILER_OVERHEAD")[4], "overheadType");
    let v: String = c
        .query_row(
            "SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(v, "3.25.0");
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM sqlite_master WHERE type = 'index'"
        ),
        0
    );
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM TARGET_INFO_GPU WHERE name = 'NVIDIA H100 80GB HBM3'"
        ),
        2
    );
    let lbl: String = c
        .query_row(
            "SELECT label FROM ENUM_CUDA_MEM_KIND WHERE id = 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(lbl, "Pageable");
    // Serialized ids: PID bits match PROCESSES, tid bits of globalPid are 0.
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE NOT EXISTS (SELECT 1 FROM \
             PROCESSES p WHERE p.pid = (r.globalTid >> 24) & 0xFFFFFF AND p.globalPid = \
             (r.globalTid & 0xFFFFFFFFFF000000))"
        ),
        0
    );
    assert_eq!(
        one(&c, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME") / 1_000_000_000,
        1
    );
}

#[test]
fn gpu_work_has_launch_in_same_process() {
    let (_d, path, t) = gen(&NsysConfig::small());
    let c = open(&path);
    for table in ["KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION"] {
        let orphans = one(
            &c,
            &format!(
                "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{table} k WHERE (SELECT count(*) FROM \
                 CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId AND \
                 (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid AND r.start < k.start) <> 1"
            ),
        );
        assert_eq!(orphans, 0, "{table}");
    }
    // Launch names by GPU table.
    let names = |table: &str| -> Vec<String> {
        let mut st = c
            .prepare(&format!(
                "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_{table} k JOIN \
                 CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND \
                 (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid JOIN StringIds s ON s.id = \
                 r.nameId ORDER BY 1"
            ))
            .unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    };
    assert_eq!(
        names("KERNEL"),
        ["cuLaunchKernelEx", "cudaLaunchKernel_v7000"]
    );
    assert_eq!(names("MEMCPY"), ["cudaMemcpyAsync_v3020"]);
    assert_eq!(names("MEMSET"), ["cudaMemsetAsync_v3020"]);
    assert_eq!(names("SYNCHRONIZATION"), ["cudaStreamSynchronize_v3020"]);
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE syncType <> 3"
        ),
        0
    );
    // Correlation ids are unique within a process and collide across processes.
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY \
             correlationId, globalTid & 0xFFFFFFFFFF000000 HAVING count(*) > 1)"
        ),
        0
    );
    let shared = one(
        &c,
        "SELECT count(*) FROM (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY \
         correlationId HAVING count(DISTINCT globalPid) > 1)",
    );
    assert!(shared > 1000, "{shared}");
    assert_eq!(
        one(
            &c,
            "SELECT min(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME"
        ),
        1
    );
    for (&pid, &max) in &t.max_correlation_by_pid {
        let got = one(
            &c,
            &format!(
                "SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE globalTid >> 24 & 0xFFFFFF = {pid}"
            ),
        );
        assert_eq!(got, max);
    }
    // By launch class.
    let drv = one(
        &c,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON \
         r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid \
         WHERE r.eventClass = 1",
    );
    assert_eq!(drv as u64, t.kernels_by_launch_class[&1]);
}

#[test]
fn streams_and_steps() {
    let cfg = NsysConfig::small();
    let (_d, path, t) = gen(&cfg);
    let c = open(&path);
    // No overlap on a stream; overlap across streams of a device.
    let same = one(
        &c,
        "SELECT count(*) FROM (SELECT start, lag(end) OVER (PARTITION BY globalPid, deviceId, \
         streamId ORDER BY start) AS pe FROM (SELECT start, end, globalPid, deviceId, streamId \
         FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, end, globalPid, deviceId, \
         streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, end, globalPid, \
         deviceId, streamId FROM CUPTI_ACTIVITY_KIND_MEMSET)) WHERE start < pe",
    );
    assert_eq!(same, 0);
    let cross = one(
        &c,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL a JOIN CUPTI_ACTIVITY_KIND_KERNEL b ON \
         a.globalPid = b.globalPid AND a.streamId = 7 AND b.streamId = 13 AND a.start < b.end \
         AND b.start < a.end",
    );
    assert!(cross > 100, "{cross}");
    assert_eq!(t.kernels_by_stream.len(), 2 * cfg.processes);
    // Steps.
    let mut st = c
        .prepare(
            "SELECT globalTid >> 24 & 0xFFFFFF, CAST(substr(text, 14) AS INTEGER), start, end \
             FROM NVTX_EVENTS WHERE text LIKE 'ProfilerStep#%' ORDER BY 1, 2",
        )
        .unwrap();
    let steps: Vec<(i64, i64, i64, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(steps, t.steps);
    assert_eq!(steps.len(), cfg.processes * cfg.steps);
    assert_eq!(steps[0].1, cfg.first_step as i64);
    // Idle gaps: all GPU work of a step lies inside it.
    let outside = one(
        &c,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON \
         r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid \
         JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.text LIKE 'ProfilerStep#%' AND \
         n.start <= r.start AND r.end <= n.end WHERE k.end > n.end",
    );
    assert_eq!(outside, 0);
    let in_steps: u64 = t.kernels_by_step.values().map(|v| v.0).sum();
    assert_eq!(in_steps + t.kernels_outside_ranges, t.kernels);
    assert_eq!(t.kernels_outside_ranges, cfg.processes as u64);
    // NVTX counts.
    assert_eq!(
        one(&c, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59") as u64,
        t.nvtx_ranges
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 34") as u64,
        t.nvtx_marks
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 75") as u64,
        t.nvtx_domains
    );
    let by_text = map2(
        &c,
        "SELECT coalesce(n.text, s.value), count(*), 0 FROM NVTX_EVENTS n LEFT JOIN StringIds s \
         ON s.id = n.textId WHERE eventType = 59 AND coalesce(n.text, s.value) NOT LIKE \
         'ProfilerStep#%' GROUP BY 1",
    );
    let by_text: BTreeMap<String, u64> = by_text.into_iter().map(|(k, v)| (k, v.0)).collect();
    assert_eq!(by_text, t.nvtx_by_text);
    assert!(
        one(
            &c,
            "SELECT count(*) FROM NVTX_EVENTS WHERE textId IS NOT NULL AND text IS NULL"
        ) > 0
    );
    // The NCCL domain: name on the eventType 75 row of the same process.
    let nccl = one(
        &c,
        "SELECT count(*) FROM NVTX_EVENTS n JOIN NVTX_EVENTS d ON d.eventType = 75 AND \
         d.domainId = n.domainId AND d.globalTid >> 24 = n.globalTid >> 24 AND d.text = 'NCCL' \
         WHERE n.eventType = 59",
    );
    assert_eq!(nccl as u64, t.nvtx_by_text["ncclAllReduce"]);
}

#[test]
fn attribution_matches_truth() {
    let (_d, path, t) = gen(&NsysConfig::small());
    let c = open(&path);
    // Innermost enclosing range = the latest-starting range containing the launch call.
    let q = |domain_filter: &str| {
        map2(
            &c,
            &format!(
                "SELECT name, count(*), sum(d) FROM (SELECT k.end - k.start AS d, (SELECT \
                 coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = \
                 n.textId WHERE n.eventType = 59 AND n.globalTid = r.globalTid AND n.start <= \
                 r.start AND r.end <= n.end {domain_filter} ORDER BY n.start DESC LIMIT 1) AS \
                 name FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON \
                 r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = \
                 k.globalPid) WHERE name IS NOT NULL GROUP BY 1"
            ),
        )
    };
    assert_eq!(q(""), t.kernels_by_range);
    assert_eq!(q("AND n.domainId = 0"), t.kernels_by_default_range);
    assert!(t.kernels_by_range.contains_key("ncclAllReduce"));
    assert!(t.kernels_by_default_range.contains_key("nccl:all_reduce"));
    assert_eq!(
        t.kernels_by_range["aten::addmm"].0,
        t.kernels_by_range["aten::mm"].0
    );
    assert!(!t.kernels_by_range.contains_key("aten::linear"));
}

#[test]
fn memcpy_runtime_and_busy() {
    let cfg = NsysConfig::small();
    let (_d, path, t) = gen(&cfg);
    let c = open(&path);
    let got = map2(
        &c,
        "SELECT '[CUDA memcpy ' || e.label || ']', count(*), sum(m.end - m.start) FROM \
         CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind GROUP BY 1",
    );
    assert_eq!(got, t.memcpy_by_op);
    assert_eq!(got.len(), 3);
    let n = (cfg.processes * cfg.steps) as u64;
    assert_eq!(
        got["[CUDA memcpy Host-to-Device]"].0,
        n + cfg.processes as u64
    );
    assert_eq!(got["[CUDA memcpy Device-to-Host]"].0, n);
    assert_eq!(
        one(&c, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 AND (srcKind, dstKind) <> (1, 2)"),
        0
    );
    assert_eq!(
        one(&c, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET") as u64,
        t.memset.0
    );
    assert_eq!(
        one(&c, "SELECT sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET"),
        t.memset.2
    );
    // cuda_api_sum's suffix rule.
    let api = map2(
        &c,
        "SELECT CASE substr(s.value, -6, 2) WHEN '_v' THEN substr(s.value, 1, length(s.value) - 6) \
         ELSE s.value END, count(*), sum(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN \
         StringIds s ON s.id = r.nameId GROUP BY 1",
    );
    assert_eq!(api, t.runtime_by_name);
    for k in [
        "cudaLaunchKernel",
        "cudaMemcpyAsync",
        "cudaStreamSynchronize",
        "cudaStreamIsCapturing_v10000",
        "cudaGetDeviceProperties_v2_v12000",
        "cuGetProcAddress_v2",
        "cuLaunchKernelEx",
    ] {
        assert!(api.contains_key(k), "{k}");
    }
    assert_eq!(api_sum_name("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
    assert_eq!(
        api_sum_name("cudaLaunchKernelExC_v11060"),
        "cudaLaunchKernelExC_v11060"
    );
    assert_eq!(
        one(
            &c,
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 1"
        ) as u64,
        t.runtime_by_class[&1]
    );
    // Busy union per device.
    for (&(pid, dev), &busy) in &t.busy_ns_by_device {
        let mut st = c
            .prepare(&format!(
                "SELECT start, end FROM (SELECT start, end, globalPid, deviceId FROM \
                 CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, end, globalPid, deviceId FROM \
                 CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, end, globalPid, deviceId FROM \
                 CUPTI_ACTIVITY_KIND_MEMSET) WHERE globalPid = {} AND deviceId = {dev} ORDER BY 1",
                global_pid(pid)
            ))
            .unwrap();
        let iv: Vec<(i64, i64)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let (mut sum, mut cur) = (0, iv[0]);
        for &(s, e) in &iv[1..] {
            if s <= cur.1 {
                cur.1 = cur.1.max(e);
            } else {
                sum += cur.1 - cur.0;
                cur = (s, e);
            }
        }
        sum += cur.1 - cur.0;
        assert_eq!(sum, busy);
    }
    assert_eq!(
        one(&c, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME"),
        t.first_ns
    );
}

#[test]
fn deterministic_and_refuses_existing() {
    let cfg = NsysConfig {
        steps: 1,
        kernels_per_step: 50,
        ..NsysConfig::small()
    };
    let (_d1, p1, t1) = gen(&cfg);
    let (_d2, p2, t2) = gen(&cfg);
    assert_eq!(t1, t2);
    assert_eq!(std::fs::read(&p1).unwrap(), std::fs::read(&p2).unwrap());
    let (_d3, _p3, t3) = gen(&NsysConfig {
        seed: 8,
        ..cfg.clone()
    });
    assert_ne!(t1.kernel_sum_by_name, t3.kernel_sum_by_name);
    assert!(write_nsys(&cfg, &p1).is_err());
    let w = NsysConfig::with_kernels(5_000_000);
    assert_eq!(w.processes * w.steps * w.kernels_per_step, 5_000_000);
}

/// `cargo test --release --workspace -- --ignored synth_nsys_5m --nocapture`
#[test]
#[ignore]
fn synth_nsys_5m() {
    let cfg = NsysConfig::with_kernels(5_000_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.sqlite");
    let t0 = std::time::Instant::now();
    let t = write_nsys(&cfg, &path).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&path).unwrap().len();
    let runtime: u64 = t.runtime_by_name.values().map(|v| v.0).sum();
    println!(
        "synth_nsys_5m: {} kernels, {} runtime rows, {} NVTX ranges in {secs:.2} s, {:.1} MiB",
        t.kernels,
        runtime,
        t.nvtx_ranges,
        bytes as f64 / (1 << 20) as f64
    );
    assert_eq!(t.kernels, 5_000_000);
}
