use super::*;

/// The text ends at its first NUL: whatever follows (a Parse's
/// parameter types, or garbage) never changes the verdict, wherever
/// the NUL falls, including inside words, comments and literals.
#[test]
fn a_nul_ends_the_text_wherever_it_falls() {
    let queries: &[&[u8]] = &[
        b"SELECT abalance FROM pgbench_accounts WHERE aid = 12345;",
        b"select pg_advisory_lock(1)",
        b"select pg_try_advisory_lock(1); select 1",
        b"select pg_advisory_xact_lock(1)",
        b"select set_config('work_mem', '1MB', false)",
        b"select set_config('a.b', '1', false)",
        b"select 1; set work_mem = 1",
        b"select 1; /* c */ reset all",
        b"/* c */ set search_path = x",
        b"-- c\nlisten x",
        b"deallocate s1",
        b"create temp table t (a int)",
        b"declare c cursor with hold for select 1",
    ];
    let tails: &[&[u8]] = &[b"", b"; set work_mem = 2", b"'; select pg_advisory_lock(1) */ set x = 1", b"\n(x"];
    for q in queries {
        for cut in 0..=q.len() {
            for tail in tails {
                let text = [&q[..cut], b"\0", tail].concat();
                assert_eq!(classify(&text), classify(&q[..cut]), "{:?}", String::from_utf8_lossy(&text));
            }
        }
    }
}

/// The quick path gives what reading the text cut at its NUL gives,
/// for texts cut at every byte, with a NUL put at every byte, and with
/// text after the NUL that would change the verdict were it read.
#[test]
fn the_quick_path_agrees_with_reading_the_cut_text() {
    let queries: &[&[u8]] = &[
        b"SELECT abalance FROM pgbench_accounts WHERE aid = 12345;",
        b"select pg_try_advisory_lock(1); select 1; set work_mem = 1",
        b"select x_advisory_lock(1), pg_advisory_xact_lock(2); RESET all",
        b"select set_config('work_mem', '1MB', false); set x.y = 1",
        b"SELECT pg_catalog.SET_CONFIG ( /* c */ 'a.b','1',false)",
        b"select a_b; /* c; */ -- d\n set search_path = x; reset role",
        b"/* lead */ select 1 ; ; set local x = 1; set session role r",
        b"-- c\nselect 1;set application_name = 'a';reset statement_timeout",
        b"  update t set a_b = 1 where c = ';' returning pg_advisory_lock",
        b"with x as (select 1) select * from x; discard all",
        b"s;_;_s;set_config(;set_config('",
    ];
    let tails: &[&[u8]] = &[b"", b"; set work_mem = 2", b"*/ set x = 1; select pg_advisory_lock(1)", b"_lock(1)"];
    let reference = |t: &[u8]| classify_cut(until_nul(&t[..t.len().min(INSPECT_LIMIT)]));
    for q in queries {
        for cut in 0..=q.len() {
            for tail in tails {
                let text = [&q[..cut], b"\0", tail].concat();
                assert_eq!(classify(&text), reference(&text), "{:?}", String::from_utf8_lossy(&text));
                let mut nul_inside = q.to_vec();
                nul_inside[cut.min(q.len() - 1)] = 0;
                let text = [&nul_inside[..], tail].concat();
                assert_eq!(classify(&text), reference(&text), "{:?}", String::from_utf8_lossy(&text));
            }
            assert_eq!(classify(&q[..cut]), reference(&q[..cut]), "{:?}", String::from_utf8_lossy(&q[..cut]));
        }
    }
}

#[test]
fn deallocate_forms() {
    assert_eq!(classify(b"DEALLOCATE s1"), Sql::Deallocate(b"s1".to_vec()));
    assert_eq!(classify(b"  deallocate prepare \"My\"\"S\" ; "), Sql::Deallocate(b"My\"S".to_vec()));
    assert_eq!(classify(b"deallocate S1;"), Sql::Deallocate(b"s1".to_vec()));
    assert_eq!(classify(b"DEALLOCATE ALL"), Sql::DropsAll);
    assert_eq!(classify(b"deallocate \"all\""), Sql::Deallocate(b"all".to_vec()));
    assert_eq!(classify(b"discard all"), Sql::DropsAll);
    assert_eq!(classify(b"deallocate s1; select 1"), Sql::Other);
    assert_eq!(classify(b"deallocate \"unterminated"), Sql::Other);
    assert_eq!(classify(b"discard plans"), Sql::Other);
}

#[test]
fn session_features_pin() {
    assert_eq!(classify(b"LISTEN chan"), Sql::Pins("LISTEN"));
    assert_eq!(classify(b"/* c */ -- x\n listen chan"), Sql::Pins("LISTEN"));
    assert_eq!(classify(b"select pg_advisory_lock(1)"), Sql::Pins("session advisory lock"));
    assert_eq!(classify(b"SELECT PG_TRY_ADVISORY_LOCK_SHARED(1)"), Sql::Pins("session advisory lock"));
    assert_eq!(classify(b"select pg_advisory_xact_lock(1)"), Sql::Other);
    assert_eq!(classify(b"select pg_advisory_unlock(1), x_advisory_lock(2)"), Sql::Other);
    assert_eq!(classify(b"pg_advisory_lock"), Sql::Pins("session advisory lock"));
    assert_eq!(classify(b"select 1 -- pg_try_advisory_lock"), Sql::Pins("session advisory lock"));
    assert_eq!(classify(b"declare c cursor with hold for select 1"), Sql::Pins("DECLARE ... WITH HOLD"));
    assert_eq!(classify(b"declare c cursor for select 1"), Sql::Other);
    assert_eq!(classify(b"create temp table t (a int)"), Sql::Pins("temporary table"));
    assert_eq!(classify(b"create local temporary table t (a int)"), Sql::Pins("temporary table"));
    assert_eq!(classify(b"create temp table t (a int) on commit drop"), Sql::Other);
    assert_eq!(classify(b"create table t (a int)"), Sql::Other);
    assert_eq!(classify(b"prepare p as select 1"), Sql::Pins("SQL PREPARE"));
}

#[test]
fn session_set_of_unreported_parameters_is_flagged() {
    assert_eq!(classify(b"SET search_path = a"), Sql::SessionSet);
    assert_eq!(classify(b"set session work_mem to '1MB'"), Sql::SessionSet);
    assert_eq!(classify(b"set \"statement_timeout\" to 5"), Sql::SessionSet);
    assert_eq!(classify(b"set session characteristics as transaction read only"), Sql::SessionSet);
    assert_eq!(classify(b"set local work_mem to '1MB'"), Sql::Other);
    assert_eq!(classify(b"set local search_path = sb, public"), Sql::SessionSet, "names resolve otherwise");
    assert_eq!(classify(b"begin; SET LOCAL Search_Path TO sb"), Sql::SessionSet);
    assert_eq!(classify(b"set transaction isolation level serializable"), Sql::Other);
    assert_eq!(classify(b"SET TIME ZONE 'UTC'"), Sql::Other);
    assert_eq!(classify(b"set application_name = 'x'"), Sql::Other);
    assert_eq!(classify(b"set DateStyle = ISO"), Sql::Other);
    assert_eq!(classify(b"RESET ALL"), Sql::SessionSet);
    assert_eq!(classify(b"reset statement_timeout"), Sql::SessionSet);
    assert_eq!(classify(b"reset application_name"), Sql::Other);
    assert_eq!(classify(b"reset myapp.x"), Sql::Other);
    assert_eq!(classify(b"do $$ begin perform 1; end $$"), Sql::SessionSet);
    assert_eq!(classify(b"begin; set lock_timeout = 1; commit"), Sql::SessionSet);
    assert_eq!(classify(b"begin; set local lock_timeout = 1; commit"), Sql::Other);
}

#[test]
fn set_config_is_read_back_or_pins() {
    assert_eq!(classify(b"select set_config('statement_timeout', '1s', false)"), Sql::SessionSet);
    assert_eq!(classify(b"SELECT pg_catalog.SET_CONFIG ( 'work_mem','1MB',false)"), Sql::SessionSet);
    assert_eq!(classify(b"select set_config('app.user', '1', false)"), Sql::Pins("set_config of a custom parameter"));
    assert_eq!(classify(b"select set_config($1, $2, false)"), Sql::Pins("set_config of a name weir cannot read"));
    assert_eq!(classify(b"select my_set_configs()"), Sql::Other);
    assert_eq!(classify(b"select reset_config"), Sql::Other);
}

#[test]
fn what_weir_cannot_follow_pins() {
    assert_eq!(classify(b"SET ROLE other"), Sql::Pins("SET ROLE"));
    assert_eq!(classify(b"set session authorization bob"), Sql::Pins("SET SESSION AUTHORIZATION"));
    assert_eq!(classify(b"set session role bob"), Sql::Pins("SET ROLE"));
    assert_eq!(classify(b"set myapp.tenant = '7'"), Sql::Pins("SET of a custom parameter"));
    assert_eq!(classify(b"set \"myapp.tenant\" = '7'"), Sql::Pins("SET of a custom parameter"));
    assert_eq!(classify(b"select 1; set myapp.tenant = '7'"), Sql::Pins("SET of a custom parameter"));
}

#[test]
fn ddl_is_flagged() {
    assert_eq!(classify(b"DROP TYPE mood"), Sql::Ddl);
    assert_eq!(classify(b" alter table t alter column a type text"), Sql::Ddl);
    assert_eq!(classify(b"dropped"), Sql::Other);
    assert_eq!(classify(b"create type mood as enum ('a')"), Sql::Other);
}

#[test]
fn odd_input_is_harmless() {
    assert_eq!(classify(b""), Sql::Other);
    assert_eq!(classify(b"/* unterminated"), Sql::Other);
    assert_eq!(classify(b"set"), Sql::Other);
    assert_eq!(classify(&[0xff, 0xfe, b' ', b'x']), Sql::Other);
    let long = [b"select 1 ".as_slice(), &vec![b' '; 2000], b"pg_advisory_lock(1)"].concat();
    assert_eq!(classify(&long), Sql::Other, "only the head is inspected");
}
