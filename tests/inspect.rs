//! What operators look for and do in bulk: events by subject, runs by
//! filter (an input value included), a run's detail, dead letters by
//! filter, and bulk retries and discards that act on exactly the ids found
//! (DESIGN.md invariant 10: bad input is a typed error; nothing changes).
//! Each test runs on every backend (`on_backends!`).

use reflexr_testkit as common;

use common::backend::TestBackend;
use common::on_backends;
use reflexr::inspect::{DeadLetterFilter, DeadLetterKind, RunFilter, RunsFeed};
use reflexr::limits::SCAN_WINDOW;
use reflexr::{
    Clock, Decision, Engine, Enqueue, ManualClock, NewEvent, Query, RetryPolicy, Rule, RunState,
    Scope,
};

on_backends!(
    an_unfiltered_page_walk_meets_every_event_once_and_ends_at_the_head,
    a_rare_subject_is_found_a_bounded_window_at_a_time_without_gaps,
    runs_are_found_by_state_action_scope_and_a_value_in_their_input,
    a_bulk_retry_acts_on_exactly_the_ids_its_dry_run_found,
    dead_letters_are_found_by_kind_and_consumer_and_settled_in_bulk,
    the_runs_feed_gives_each_change_once_and_resumes_from_its_token,
);

/// An engine on the place with the workspace `shop`.
fn open<B: TestBackend>(place: &B::Place, types: &[&str]) -> Engine<B> {
    let e = B::open(place, &ManualClock::new(1_800_000_000_000), "test");
    e.ensure_workspace("shop", types).unwrap();
    e
}

/// A shop: `order` events fire a charge per customer scope; the charge
/// fails for customers whose name starts with `bad`, and emits `charged`
/// otherwise.
fn shop<B: TestBackend>(place: &B::Place) -> Engine<B> {
    let e = open(place, &["order", "charged", "noise"]);
    e.register_rule(
        Rule::new("charge", "shop")
            .on(["order"])
            .scope(Scope::payload("customer"))
            .action("charge")
            .retry(RetryPolicy::never())
            .decide(|ev| Ok(Decision::Fire(ev.payload()?))),
    )
    .unwrap();
    e.register_action("charge", |run, ctx| {
        let input: serde_json::Value = run.input()?;
        if input["customer"].as_str().unwrap().starts_with("bad") {
            return Err("card declined".into());
        }
        ctx.emit("charged", NewEvent::new("charged", "charge", "shop", 0))?;
        Ok(())
    })
    .unwrap();
    e
}

fn order(customer: &str, n: i64) -> NewEvent {
    NewEvent::new("order", format!("customer/{customer}"), customer, 0)
        .payload(&serde_json::json!({ "customer": customer, "n": n }))
}

fn an_unfiltered_page_walk_meets_every_event_once_and_ends_at_the_head<B: TestBackend>() {
    // Invariant 1 for paged reads without a filter: pages follow one another
    // with no gap or repeat, and the last says the head was reached.
    let place = B::place();
    let e = open::<B>(&place, &["order", "noise"]);
    e.write(|tx| {
        for i in 0..250 {
            tx.append("shop", &order("ada", i))?;
        }
        Ok(())
    })
    .unwrap();
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = e
            .events_page(&Query::new("shop").after(after).limit(100))
            .unwrap();
        seen.extend(page.events.iter().map(|ev| ev.seq));
        match page.next_after {
            Some(next) => {
                assert_eq!(page.events.len(), 100, "a page that goes on is full");
                after = next;
            }
            None => break,
        }
    }
    assert_eq!(seen, (1..=250).collect::<Vec<i64>>());
    // Exactly at the head: a full page still says go on, the next is empty.
    let last = e
        .events_page(&Query::new("shop").after(150).limit(100))
        .unwrap();
    assert_eq!(last.next_after, Some(250));
    let empty = e
        .events_page(&Query::new("shop").after(250).limit(100))
        .unwrap();
    assert!(empty.events.is_empty());
    assert_eq!(empty.next_after, None);
    // A workspace the file does not have is named, not a quiet empty log.
    let err = e.events_page(&Query::new("shoop")).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

fn a_rare_subject_is_found_a_bounded_window_at_a_time_without_gaps<B: TestBackend>() {
    // Invariant 1 for paged reads: following next_after from 0 meets every
    // matching event once, in order, however far apart they are.
    let place = B::place();
    let e = open::<B>(&place, &["order", "noise"]);
    let n = SCAN_WINDOW * 2 + 500;
    e.write(|tx| {
        for i in 0..n {
            let subject = if i % 7_000 == 3 { "rare" } else { "common" };
            tx.append("shop", &NewEvent::new("noise", subject, "app", 0))?;
        }
        Ok(())
    })
    .unwrap();
    let mut found = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let page = e
            .events_page(&Query::new("shop").after(after).subject("rare").limit(2))
            .unwrap();
        pages += 1;
        found.extend(page.events.iter().map(|ev| ev.seq));
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    let want: Vec<i64> = (0..n as i64)
        .filter(|i| i % 7_000 == 3)
        .map(|i| i + 1)
        .collect();
    assert_eq!(found, want);
    assert!(pages >= 3, "{pages} pages: a window cannot cover the log");
    // The same subject through the unbounded read, and by id.
    let all = e
        .read(&Query::new("shop").subject("rare").limit(100))
        .unwrap();
    assert_eq!(all.len(), want.len());
    let one = e.event_by_id("shop", &all[0].id).unwrap().unwrap();
    assert_eq!(one.seq, all[0].seq);
    assert!(e.event_by_id("shop", "no-such-id").unwrap().is_none());
}

/// Invariant 10 for the view: runs found by every filter, a page at a
/// time, a value in their input matched by type; bad filters refused.
fn runs_are_found_by_state_action_scope_and_a_value_in_their_input<B: TestBackend>() {
    let place = B::place();
    let e = shop::<B>(&place);
    for (i, c) in ["ada", "bad-bob", "grace", "bad-carl", "ada"]
        .iter()
        .enumerate()
    {
        e.append("shop", &order(c, i as i64)).unwrap();
    }
    e.run_until_idle().unwrap();

    let dead = e
        .find_runs(&RunFilter::new().state(RunState::Dead))
        .unwrap();
    let scopes: Vec<_> = dead.runs.iter().map(|r| r.scope.clone().unwrap()).collect();
    assert_eq!(scopes, ["bad-carl", "bad-bob"], "newest first");
    let by_input = e
        .find_runs(&RunFilter::new().input("customer", serde_json::json!("ada")))
        .unwrap();
    assert_eq!(by_input.runs.len(), 2);
    let by_number = e
        .find_runs(&RunFilter::new().input("$.n", serde_json::json!(2)))
        .unwrap();
    assert_eq!(by_number.runs[0].scope.as_deref(), Some("grace"));
    assert!(
        e.find_runs(&RunFilter::new().input("n", serde_json::json!("2")))
            .unwrap()
            .runs
            .is_empty(),
        "the text \"2\" is not the number 2"
    );
    let page = e
        .find_runs(&RunFilter::new().scope("ada").limit(1))
        .unwrap();
    assert_eq!(page.runs.len(), 1);
    let rest = e
        .find_runs(&RunFilter::new().scope("ada").before(page.next.unwrap()))
        .unwrap();
    assert_eq!(rest.runs.len(), 1);
    assert_ne!(rest.runs[0].id, page.runs[0].id);

    // A run's detail: its input, the event that fired it, what it emitted.
    let ok = &by_number.runs[0];
    let detail = e.run_detail(&ok.id).unwrap().unwrap();
    assert_eq!(detail.event.unwrap().seq, ok.event_seq.unwrap());
    assert_eq!(detail.emitted.len(), 1);
    assert_eq!(detail.emitted[0].id, format!("{}/charged", ok.id));
    assert!(e.run_detail("no-such-run").unwrap().is_none());

    for bad in [
        RunFilter::new().limit(0),
        RunFilter::new().limit(reflexr::limits::MAX_PAGE + 1),
        RunFilter::new().action("not a name"),
        RunFilter::new().input("", serde_json::json!(1)),
    ] {
        assert!(e.find_runs(&bad).unwrap_err().is_bad_input(), "{bad:?}");
    }
}

fn a_bulk_retry_acts_on_exactly_the_ids_its_dry_run_found<B: TestBackend>() {
    // Invariant 5 through operators: only dead runs are retried, each once,
    // each on the record; what is no longer dead is skipped and said why.
    let place = B::place();
    let e = shop::<B>(&place);
    for (i, c) in ["bad-1", "bad-2", "ok", "bad-3"].iter().enumerate() {
        e.append("shop", &order(c, i as i64)).unwrap();
    }
    e.run_until_idle().unwrap();
    let found = e
        .operator("ops", "a dry run")
        .unwrap()
        .matching_dead_runs(&RunFilter::new(), 100)
        .unwrap();
    assert_eq!((found.ids.len(), found.more), (3, false));
    let two = e
        .operator("ops", "a dry run")
        .unwrap()
        .matching_dead_runs(&RunFilter::new(), 2)
        .unwrap();
    assert_eq!((two.ids.len(), two.more), (2, true));
    assert!(
        e.operator("ops", "a dry run")
            .unwrap()
            .matching_dead_runs(&RunFilter::new().state(RunState::Succeeded), 10)
            .unwrap_err()
            .is_bad_input()
    );

    // One of them is discarded meanwhile: the bulk retry skips it.
    let ops = e.operator("ops", "the card service is back").unwrap();
    ops.discard_run(&found.ids[0]).unwrap();
    let bulk = ops.retry_runs(&found.ids).unwrap();
    assert_eq!(bulk.done, found.ids[1..]);
    assert_eq!(bulk.skipped.len(), 1);
    assert!(bulk.skipped[0].1.contains("not dead"), "{:?}", bulk.skipped);
    assert_eq!(
        e.runs(Some(RunState::Ready), 10).unwrap().len(),
        2,
        "exactly those two are ready again"
    );
    let audit = e.audit_log(10).unwrap();
    assert_eq!(
        audit
            .iter()
            .filter(|a| a.action.as_str() == "retry_run")
            .count(),
        2
    );
    let too_many: Vec<String> = (0..=reflexr::limits::MAX_BULK)
        .map(|i| i.to_string())
        .collect();
    assert!(ops.retry_runs(&too_many).unwrap_err().is_bad_input());
}

/// Dead letters found by kind and consumer and settled in bulk, each once
/// (a second settlement skipped and said why); invariant 10: a run that is
/// not dead is a conflict.
fn dead_letters_are_found_by_kind_and_consumer_and_settled_in_bulk<B: TestBackend>() {
    let place = B::place();
    let e = shop::<B>(&place);
    for (i, c) in ["bad-1", "bad-2", "bad-3"].iter().enumerate() {
        e.append("shop", &order(c, i as i64)).unwrap();
    }
    e.run_until_idle().unwrap();
    let runs = e
        .find_dead_letters(&DeadLetterFilter::new().kind(DeadLetterKind::Run))
        .unwrap();
    assert_eq!(runs.dead_letters.len(), 3);
    assert!(
        e.find_dead_letters(&DeadLetterFilter::new().consumer("someone-else"))
            .unwrap()
            .dead_letters
            .is_empty()
    );
    let found = e
        .operator("ops", "a dry run")
        .unwrap()
        .matching_dead_letters(&DeadLetterFilter::new().consumer("charge"), 10)
        .unwrap();
    assert_eq!(found.ids.len(), 3);
    let ops = e.operator("ops", "known declines").unwrap();
    let bulk = ops.discard_dead_letters(&found.ids[..2]).unwrap();
    assert_eq!(bulk.done.len(), 2);
    let again = ops.discard_dead_letters(&found.ids).unwrap();
    assert_eq!((again.done.len(), again.skipped.len()), (1, 2));
    assert!(again.skipped[0].1.contains("resolved already"));
    assert!(e.dead_letters(false, 10).unwrap().is_empty());
    let all = e
        .find_dead_letters(&DeadLetterFilter::new().include_resolved(true))
        .unwrap();
    assert_eq!(all.dead_letters.len(), 3);
    // A run that is not dead is a conflict, not bad input of the caller's.
    let err = ops.retry_run(&e.runs(None, 1).unwrap()[0].id).unwrap_err();
    assert!(err.is_conflict(), "{err}");
}

/// The feed of run changes (the admin stream's `runs` topic): every change
/// comes, in order, once for each time it is read changed; a position
/// written down and read back goes on without missing a change (on SQLite
/// it may repeat the runs of the millisecond it stood at); a position that
/// is neither kind is a typed error (invariant 10).
fn the_runs_feed_gives_each_change_once_and_resumes_from_its_token<B: TestBackend>() {
    let place = B::place();
    let clock = ManualClock::new(1_800_000_000_000);
    let e = B::open(&place, &clock, "test");
    e.register_action("work", |_, _| Ok(())).unwrap();
    let mut feed = RunsFeed::<B>::since(clock.now_ms());
    let enqueue = |n: i64| {
        e.enqueue(&Enqueue::new("work", &serde_json::json!({ "n": n })))
            .unwrap()
            .id
    };
    let ids: Vec<String> = (0..3).map(enqueue).collect();
    // Reads `n` changes, two at a time. (On PostgreSQL a change comes once
    // every transaction older than it has ended, and the other tests on
    // the server write too: it may take a moment.)
    let take = |feed: &mut RunsFeed<B>, n: usize| -> Vec<(String, RunState)> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut got = Vec::new();
        while got.len() < n {
            assert!(std::time::Instant::now() < deadline, "only {got:?}");
            got.extend(
                e.runs_feed(feed, 2)
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.id, r.state)),
            );
        }
        got
    };
    let read = |feed: &mut RunsFeed<B>| -> Vec<(String, RunState)> {
        e.runs_feed(feed, 100)
            .unwrap()
            .into_iter()
            .map(|r| (r.id, r.state))
            .collect()
    };
    let ready: Vec<(String, RunState)> =
        ids.iter().map(|id| (id.clone(), RunState::Ready)).collect();
    assert_eq!(take(&mut feed, 3), ready, "each new run once, in order");
    assert!(read(&mut feed).is_empty(), "nothing changed since");

    clock.advance(std::time::Duration::from_millis(5));
    assert_eq!(e.run_until_idle().unwrap().succeeded, 3);
    let done: Vec<(String, RunState)> = ids
        .iter()
        .map(|id| (id.clone(), RunState::Succeeded))
        .collect();
    assert_eq!(
        take(&mut feed, 3),
        done,
        "claimed and settled: read once, as it is now"
    );

    let mut resumed = RunsFeed::<B>::from_token(&feed.token()).unwrap();
    let again = read(&mut resumed);
    match B::NAME {
        "sqlite" => assert!(again.iter().all(|r| done.contains(r)), "{again:?}"),
        _ => assert!(again.is_empty(), "{again:?}"),
    }
    clock.advance(std::time::Duration::from_millis(5));
    let fourth = enqueue(3);
    assert_eq!(take(&mut resumed, 1), [(fourth, RunState::Ready)]);
    assert!(read(&mut resumed).is_empty());

    for bad in ["", "soon", "tx:1", "tx:x:2", "tx:1:2:3"] {
        let err = RunsFeed::<B>::from_token(bad).unwrap_err();
        assert!(err.is_bad_input(), "{bad:?}: {err:?}");
    }
    // A feed is its backend's: a transaction's position, which only
    // PostgreSQL's feed writes, is refused by SQLite's when read back; a
    // millisecond is every backend's.
    match B::NAME {
        "sqlite" => {
            let err = RunsFeed::<B>::from_token("tx:5:1").unwrap_err();
            assert!(err.is_bad_input(), "{err:?}");
        }
        _ => {
            let mut other = RunsFeed::<B>::from_token("1800000000000").unwrap();
            e.runs_feed(&mut other, 10).unwrap();
        }
    }
    assert!(e.runs_feed(&mut feed, 0).unwrap_err().is_bad_input());
}
