-- Conformance script for psql through weir in transaction mode, run by 20
-- psql processes at once with -v id=N -v ON_ERROR_STOP=1. A failed check
-- raises an error, so psql exits non-zero.
--
-- psql 15 speaks the simple protocol only (no \bind): its prepared
-- statements are SQL PREPARE, which weir pins to the server connection for
-- the rest of the session; everything before the PREPARE is pooled per
-- transaction.

\set QUIET 1

-- Commit and rollback.
begin;
insert into drv_psql (id, note) values (:id * 1000 + 1, 'tx');
commit;
begin;
insert into drv_psql (id, note) values (:id * 1000 + 2, 'tx');
rollback;
select count(*) = 1 as ok from drv_psql where id in (:id * 1000 + 1, :id * 1000 + 2) \gset
\if :ok \else
  do $$ begin raise exception 'commit/rollback check failed'; end $$;
\endif

-- An error inside a transaction, then recovery; and a statement timeout.
\set ON_ERROR_STOP 0
begin;
select 1 / 0;
\set e_div :LAST_ERROR_SQLSTATE
select 1;
\set e_aborted :LAST_ERROR_SQLSTATE
rollback;
begin;
set local statement_timeout = '200ms';
select pg_sleep(5);
\set e_timeout :LAST_ERROR_SQLSTATE
rollback;
\set ON_ERROR_STOP 1
select :'e_div' = '22012' and :'e_aborted' = '25P02' and :'e_timeout' = '57014' as ok \gset
\if :ok \else
  \echo errors seen: :e_div :e_aborted :e_timeout
  do $$ begin raise exception 'error/recovery check failed'; end $$;
\endif

-- NULLs and bytea with zero bytes.
select decode('000102ff007f', 'hex') = '\x000102ff007f'::bytea and (null::text) is null as ok \gset
\if :ok \else
  do $$ begin raise exception 'null/bytea check failed'; end $$;
\endif

-- COPY (the ids come from the table's sequence).
copy drv_psql (note) from stdin;
copy 0
copy 1
copy 2
copy 3
copy 4
copy 5
copy 6
copy 7
copy 8
copy 9
\.

-- SQL prepared statements: from here on the session keeps its server.
prepare twice(int) as select $1 * 2 as v;
execute twice(21) \gset
select :v = 42 as ok \gset
\if :ok \else
  do $$ begin raise exception 'prepared check failed'; end $$;
\endif
select format('prepare plus_%s(int) as select $1 + %s as v', g, g) from generate_series(1, 25) g \gexec
execute plus_25(:id) \gset
select :v = :id + 25 as ok \gset
\if :ok \else
  do $$ begin raise exception 'distinct statements check failed'; end $$;
\endif
deallocate twice;
\echo psql client :id passed
