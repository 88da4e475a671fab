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

/// The tests of this concern written once for every backend (each names
/// the invariant it checks; `on_backends!` runs it on SQLite and
/// PostgreSQL).
mod every_backend {
    use crate::shared::*;
    use common::backend::TestBackend;
    use common::on_backends;
    use common::rules::{append_rsvps, every_nth, fired};
    use reflexr::inspect::{Counter, DeadLetterFilter, RunFilter};
    use reflexr::{
        Decision, Error, ManualClock, NewEvent, OnDeadLetter, Query, RetryPolicy, Rule, RuleReset,
        RunState, Scope,
    };
    use reflexr_testkit as common;
    use serde_json::{Value, json};
    use std::sync::Arc;

    on_backends!(
        an_operator_cancels_retries_and_discards_runs_and_their_dead_letters_on_the_record,
        an_operator_replays_a_rule_and_nothing_is_made_twice,
        an_operator_finds_runs_events_and_dead_letters_by_filter_and_acts_on_them_in_bulk,
    );

    /// Operators' interventions on runs, each checked and audited: a pending
    /// run cancelled never starts; a dead run retried gets fresh attempts and
    /// its dead letter is resolved as retried; another discarded, its dead
    /// letter with it; what cannot be done is a typed error. The stats count
    /// what happened.
    fn an_operator_cancels_retries_and_discards_runs_and_their_dead_letters_on_the_record<
        B: TestBackend,
    >() {
        let (_place, _clock, e) = setup::<B>();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let f = Arc::clone(&fail);
        e.register_action("work", move |_, _| {
            if f.load(std::sync::atomic::Ordering::SeqCst) {
                Err("down".into())
            } else {
                Ok(())
            }
        })
        .unwrap();
        let once = RetryPolicy::attempts(1);
        let a = e.enqueue(&task(1).retry(once)).unwrap().id;
        let b = e.enqueue(&task(2).retry(once)).unwrap().id;
        let c = e.enqueue(&task(3).at(START_MS + 3_600_000)).unwrap().id;
        let ops = e.operator("ops", "cleaning up").unwrap();
        assert_eq!(ops.cancel_run(&c).unwrap(), RunState::Ready);
        assert_eq!(e.run_until_idle().unwrap().dead, 2);
        assert_eq!(e.dead_letters(false, 10).unwrap().len(), 2);
        let conflict = ops.cancel_run(&a).unwrap_err();
        assert!(matches!(conflict, Error::Conflict { .. }), "{conflict}");
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        ops.retry_run(&a).unwrap();
        let letter_b = e.dead_letters(false, 10).unwrap()[0].id;
        ops.discard_dead_letter(letter_b).unwrap();
        assert_eq!(e.run_until_idle().unwrap().succeeded, 1);
        let state = |id: &str| e.run(id).unwrap().unwrap().state;
        assert_eq!(
            (state(&a), state(&b), state(&c)),
            (
                RunState::Succeeded,
                RunState::Discarded,
                RunState::Cancelled
            )
        );
        assert!(
            e.dead_letters(false, 10).unwrap().is_empty(),
            "both resolved"
        );
        let resolved = e.dead_letters(true, 10).unwrap();
        let mut how: Vec<String> = resolved
            .iter()
            .map(|d| d.resolution.unwrap().to_string())
            .collect();
        how.sort();
        assert_eq!(how, ["discarded", "retried"]);
        assert!(ops.retry_run(&a).is_err(), "only a dead run is retried");
        assert!(ops.retry_run("nope").unwrap_err().is_not_found());
        let stats = e.stats().unwrap();
        assert_eq!(stats.counter(Counter::RunsDead), 2);
        assert_eq!(stats.counter(Counter::RunsSucceeded), 1);
        assert_eq!(stats.runs.get(&RunState::Succeeded), Some(&1));
        assert!(stats.dead_letters.is_empty());
        let actions: Vec<String> = e
            .audit_log(10)
            .unwrap()
            .iter()
            .map(|a| a.action.to_string())
            .collect();
        assert_eq!(actions.len(), 3, "{actions:?}");
    }

    /// Invariants 4 and 8: an operator replays a rule from zero (its cursor
    /// back, its state cleared, on the record); the replay derives the same
    /// firing ids, so nothing is made twice.
    fn an_operator_replays_a_rule_and_nothing_is_made_twice<B: TestBackend>() {
        let place = B::place();
        let clock = ManualClock::new(START_MS);
        let e = rules_engine::<B>(&place, &clock, "test");
        e.register_rule(every_nth("tenth", 10)).unwrap();
        append_rsvps(&e, 2, 20);
        assert_eq!(e.run_until_idle().unwrap().fired, 4);
        let before = fired(&e);
        e.operator("ops", "replay after a fix")
            .unwrap()
            .reset_rule("tenth", RuleReset::Replay(0))
            .unwrap();
        let idle = e.run_until_idle().unwrap();
        assert_eq!(
            (idle.decided, idle.fired),
            (40, 0),
            "decided again, made once"
        );
        assert_eq!(fired(&e), before);
        assert_eq!(e.runs(None, 100).unwrap().len(), 4);
        assert_eq!(e.stats().unwrap().counter(Counter::ReplayExisting), 4);
        assert_eq!(e.audit_log(5).unwrap()[0].action.to_string(), "reset_rule");
    }

    /// The operators' view on every backend: events by subject, runs by state,
    /// action and input, a run with the event that fired it and what it
    /// emitted, the scopes blocked behind a dead run, dead letters by filter,
    /// the feeds of changes; and a bulk retry of what a filter matched, which
    /// unblocks nothing by itself (the dead run's scope goes on once it
    /// succeeds).
    fn an_operator_finds_runs_events_and_dead_letters_by_filter_and_acts_on_them_in_bulk<
        B: TestBackend,
    >() {
        let (_place, _clock, e) = setup::<B>();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let f = Arc::clone(&fail);
        e.register_action("ship", move |run, ctx| {
            if f.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("the carrier is down".into());
            }
            let p: Value = run.input()?;
            let id = p["id"].as_str().unwrap().to_string();
            ctx.emit(
                "shipped",
                NewEvent::new("thing.gone", format!("thing/{id}"), "shipper", 3_000),
            )?;
            Ok(())
        })
        .unwrap();
        e.register_rule(
            Rule::new("shipper", "app")
                .on(["thing.made"])
                .scope(Scope::payload("id"))
                .action("ship")
                .retry(RetryPolicy::attempts(1))
                .on_dead_letter(OnDeadLetter::Block)
                .decide(|ev| Ok(Decision::fire(&ev.payload::<Value>()?))),
        )
        .unwrap();
        for id in ["a", "b", "c"] {
            e.append("app", &made(id)).unwrap();
        }
        e.append("app", &made("a")).unwrap(); // a second of scope a, behind its first
        let idle = e.run_until_idle().unwrap();
        assert_eq!((idle.fired, idle.dead), (4, 3));

        let page = e
            .events_page(&Query::new("app").subject("thing/b"))
            .unwrap();
        let types: Vec<&str> = page.events.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(types, ["thing.made", "RuleFired"]);
        let dead = e
            .find_runs(&RunFilter::new().state(RunState::Dead).action("ship"))
            .unwrap();
        assert_eq!(dead.runs.len(), 3);
        let of_b = e
            .find_runs(&RunFilter::new().input("id", json!("b")))
            .unwrap();
        assert_eq!(of_b.runs.len(), 1);
        let detail = e.run_detail(&of_b.runs[0].id).unwrap().unwrap();
        assert_eq!(detail.event.unwrap().subject, "thing/b");
        assert!(detail.emitted.is_empty());
        let blocked = e.blocked_lanes(10).unwrap();
        let mut scopes: Vec<String> = blocked.iter().map(|b| b.scope.clone()).collect();
        scopes.sort();
        assert_eq!(scopes, ["a", "b", "c"]);
        let letters = e
            .find_dead_letters(&DeadLetterFilter::new().consumer("shipper"))
            .unwrap();
        assert_eq!(letters.dead_letters.len(), 3);
        // On PostgreSQL the feed gives a change once every transaction that
        // began before it has ended, the other tests' on the server too:
        // read until it has come (on SQLite, the first read has it all).
        let mut feed = reflexr::inspect::RunsFeed::<B>::since(0);
        let mut changes = e.runs_feed(&mut feed, 100).unwrap().len();
        for _ in 0..600 {
            if changes >= 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            changes += e.runs_feed(&mut feed, 100).unwrap().len();
        }
        assert_eq!(changes, 4, "each of the four runs' changes, once");
        assert_eq!(e.dead_letters_after(0, 100).unwrap().len(), 3);

        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        let matches = e
            .operator("ops", "a dry run")
            .unwrap()
            .matching_dead_runs(&RunFilter::new(), 10)
            .unwrap();
        assert_eq!((matches.ids.len(), matches.more), (3, false));
        let ops = e.operator("ops", "the carrier is back").unwrap();
        let mut ids = matches.ids.clone();
        ids.push("no-such-run".into());
        let bulk = ops.retry_runs(&ids).unwrap();
        assert_eq!((bulk.done.len(), bulk.skipped.len()), (3, 1));
        let idle = e.run_until_idle().unwrap();
        assert_eq!(idle.succeeded, 4, "the three, then scope a's second");
        let detail = e.run_detail(&of_b.runs[0].id).unwrap().unwrap();
        assert_eq!(detail.emitted.len(), 1, "what it emitted, by its id");
        assert!(e.blocked_lanes(10).unwrap().is_empty());
        assert!(
            e.find_dead_letters(&DeadLetterFilter::new())
                .unwrap()
                .dead_letters
                .is_empty()
        );
    }
}
