//! The metrics sonde-core exports: a plugin's units become base units by
//! the documented rule.

#[test]
fn plugin_units_become_base_units_by_the_documented_rule() {
    use sonde_core::metrics::base_unit;
    let cases: [(f64, &str, f64, &str); 9] = [
        (250.0, "ms", 0.25, "seconds"),
        (3.0, "s", 3.0, "seconds"),
        (1500.0, "us", 0.0015, "seconds"),
        (42.0, "%", 0.42, "ratio"),
        (2.0, "KB", 2048.0, "bytes"),
        (1.0, "MB", 1048576.0, "bytes"),
        (7.0, "B", 7.0, "bytes"),
        (9.0, "c", 9.0, ""),
        (5.0, "widgets", 5.0, "widgets"),
    ];
    for (value, unit, want, base) in cases {
        let (v, u) = base_unit(value, unit);
        assert!((v - want).abs() < 1e-9, "{value}{unit}: {v}");
        assert_eq!(u, base, "{unit}");
    }
}
