//! `shared_traces` skips a missing directory, or fails under `GPUQ_REQUIRE_TRACES=1`. A test
//! binary of its own: it alone sets the variable in its process.

use gpuq_testkit::{shared_traces, REQUIRE_TRACES};

#[test]
fn a_missing_directory_is_skipped_unless_the_traces_are_required() {
    let kind = "no-such-kind-of-trace";
    std::env::remove_var(REQUIRE_TRACES);
    assert_eq!(shared_traces(kind), None);
    std::env::set_var(REQUIRE_TRACES, "1");
    let required = std::panic::catch_unwind(|| shared_traces(kind));
    std::env::remove_var(REQUIRE_TRACES);
    let message = required.expect_err("GPUQ_REQUIRE_TRACES=1 and no directory must panic");
    let message = message
        .downcast_ref::<String>()
        .expect("a formatted message");
    assert!(message.contains(kind), "{message}");
}
