use super::*;

fn key(name: &str, secret: &str, k: &str) -> CellKey {
    CellKey {
        namespace: "shop".into(),
        owner: "shop".into(),
        name: name.into(),
        secret: secret.into(),
        key: k.into(),
    }
}

fn read_ok(pairs: &[(&str, &[u8])]) -> Outcome {
    Outcome::Read {
        values: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), SecretValue::new(v.to_vec())))
            .collect(),
        keys: pairs.iter().map(|(k, _)| k.to_string()).collect(),
    }
}

fn problem(h: Held) -> Problem {
    match h {
        Held::Problem(p) => p,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_reference_is_pending_until_read_then_ready_with_its_value() {
    let mut book = SecretBook::default();
    let now = Instant::now();
    let k = key("token", "api", "token");
    assert!(matches!(book.want(&k, now), Held::Pending));
    let due = book.due(now);
    assert_eq!(due, [(("shop".into(), "api".into()), vec!["token".to_string()])]);
    assert!(book.due(now).is_empty(), "under way");
    assert!(book.record(&k.secret_key(), read_ok(&[("token", b"s3cret-value")]), now));
    let Held::Ready(cell) = book.want(&k, now) else {
        panic!("ready")
    };
    assert_eq!(cell.current().unwrap().expose(), b"s3cret-value");
    assert_eq!(cell.source(), "Secret shop/api key token");
    assert_eq!(cell.owner(), "shop");
    assert_eq!(book.next_due(), Some(now + REREAD_EVERY));
    // A new value reaches the same cell, with no change of state.
    assert!(!book.record(&k.secret_key(), read_ok(&[("token", b"another-value")]), now));
    assert_eq!(cell.current().unwrap().expose(), b"another-value");
}

#[test]
fn a_missing_forbidden_or_unusable_secret_is_a_problem_naming_it_and_never_its_value() {
    let mut book = SecretBook::default();
    let now = Instant::now();
    let k = key("token", "api", "token");
    book.want(&k, now);
    book.due(now);
    assert!(book.record(&k.secret_key(), Outcome::NotFound, now));
    let p = problem(book.want(&k, now));
    assert_eq!(p.reason, "SecretMissing");
    assert_eq!(
        p.message,
        "secretRef \"token\" (Secret \"api\" in namespace \"shop\", key \"token\"): the Secret does not exist"
    );
    // Retried sooner than a present one, doubling.
    assert_eq!(book.next_due(), Some(now + FIRST_RETRY));
    book.due(now + FIRST_RETRY);
    assert!(book.record(&k.secret_key(), Outcome::Forbidden, now));
    let p = problem(book.want(&k, now));
    assert_eq!(p.reason, "SecretForbidden");
    assert!(p.message.contains("RoleBinding in namespace \"shop\""), "{}", p.message);
    assert!(p.message.contains(READER_ROLE), "{}", p.message);
    assert_eq!(book.next_due(), Some(now + FIRST_RETRY * 2));
    book.due(now);
    book.record(&k.secret_key(), read_ok(&[("other", b"value-of-another-key")]), now);
    let p = problem(book.want(&k, now));
    assert_eq!(p.reason, "SecretMissing");
    assert!(
        p.message.ends_with("the Secret has no such key (its keys: other)"),
        "{}",
        p.message
    );
    assert!(!p.message.contains("value-of"), "{}", p.message);
    book.due(now);
    book.record(&k.secret_key(), read_ok(&[("token", b"short")]), now);
    let p = problem(book.want(&k, now));
    assert_eq!(p.reason, "SecretInvalid");
    assert!(p.message.contains("at least 8"), "{}", p.message);
    assert!(!p.message.contains("short"), "{}", p.message);
}

#[test]
fn an_answer_that_says_nothing_keeps_the_last_value() {
    let mut book = SecretBook::default();
    let now = Instant::now();
    let k = key("token", "api", "token");
    book.want(&k, now);
    book.due(now);
    book.record(&k.secret_key(), read_ok(&[("token", b"s3cret-value")]), now);
    book.hurry(&k.secret_key(), now);
    book.due(now);
    assert!(!book.record(
        &k.secret_key(),
        Outcome::Failed("the API server answered 500".into()),
        now
    ));
    let Held::Ready(cell) = book.want(&k, now) else {
        panic!("still ready")
    };
    assert_eq!(cell.current().unwrap().expose(), b"s3cret-value");
    assert_eq!(book.next_due(), Some(now + FIRST_RETRY), "but retried soon");
}

#[test]
fn a_second_key_of_a_read_secret_reads_it_again_and_references_share_nothing_else() {
    let mut book = SecretBook::default();
    let now = Instant::now();
    let a = key("user", "db", "username");
    let b = key("password", "db", "password");
    book.want(&a, now);
    book.due(now);
    // The Secret has both keys; the first read kept the one asked for.
    let mut first = read_ok(&[("username", b"monitoring")]);
    if let Outcome::Read { keys, .. } = &mut first {
        keys.push("password".into());
    }
    book.record(&a.secret_key(), first, now);
    assert!(matches!(book.want(&b, now), Held::Pending), "not a missing key");
    let due = book.due(now);
    assert_eq!(due[0].1, ["password", "username"], "both keys, at once");
    book.record(
        &a.secret_key(),
        read_ok(&[("username", b"monitoring"), ("password", b"pa55word-pa55word")]),
        now,
    );
    assert!(matches!(book.want(&b, now), Held::Ready(_)));
    assert_eq!(book.len(), 1, "one Secret, read once for both");
}

#[test]
fn reads_are_capped_in_flight_per_namespace_and_in_all() {
    let mut book = SecretBook::default();
    let now = Instant::now();
    for i in 0..MAX_PER_NAMESPACE {
        assert!(matches!(
            book.want(&key("t", &format!("s{i}"), "k"), now),
            Held::Pending
        ));
    }
    let p = problem(book.want(&key("t", "one-too-many", "k"), now));
    assert_eq!(p.reason, "SecretLimit");
    assert_eq!(book.due(now).len(), MAX_READS_IN_FLIGHT);
    assert_eq!(book.next_due(), None, "no room until a read ends");
    let mut other = key("t", "x", "k");
    other.namespace = "other".into();
    assert!(matches!(book.want(&other, now), Held::Pending), "another namespace");
    // Dropping what no Pod needs frees the room.
    book.retain(&BTreeSet::from([other.clone()]));
    assert_eq!(book.len(), 1);
    assert!(matches!(book.want(&key("t", "one-too-many", "k"), now), Held::Pending));
}

#[test]
fn malformed_references_are_refused_naming_them() {
    let r = |name: &str, secret: &str, key: &str| SecretRef {
        name: name.into(),
        secret_name: secret.into(),
        key: key.into(),
    };
    assert_eq!(check_refs(&[r("token", "api-token", "tls.key")]), Ok(()));
    for (refs, says) in [
        (vec![r("Token", "api", "k")], "\"Token\" is not a secret name"),
        (vec![r("t", "api", "k"), r("t", "b", "k")], "\"t\" is listed twice"),
        (vec![r("t", "API", "k")], "secretName \"API\""),
        (vec![r("t", "a..b", "k")], "secretName \"a..b\""),
        (vec![r("t", "api", "a/b")], "key \"a/b\""),
        (
            (0..9).map(|i| r(&format!("t{i}"), "a", "k")).collect(),
            "9 entries; at most 8",
        ),
    ] {
        let e = check_refs(&refs).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn retries_double_up_to_the_reread_period() {
    assert_eq!(retry_after(1), FIRST_RETRY);
    assert_eq!(retry_after(2), FIRST_RETRY * 2);
    assert_eq!(retry_after(5), FIRST_RETRY * 16);
    assert_eq!(retry_after(6), REREAD_EVERY);
    assert_eq!(retry_after(u32::MAX), REREAD_EVERY);
}
