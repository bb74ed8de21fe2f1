//! The fleet's arithmetic and its SQL, with no I/O: the key of the advisory
//! lock an instance announces itself with, the one query that moves that
//! lock and reads the fleet back, the parsing of its row, the budget the
//! limits leave the fleet, and each instance's share of it.

/// The top byte of every announcement key (an int8 advisory lock key):
/// `W`. Below it, 24 bits of instance id; the low 32 bits carry the
/// instance's `want` and `held` (16 bits each).
pub const MAGIC: i64 = 0x57;

/// The most `want` or `held` an announcement carries.
const FIELD_MAX: u32 = 0xffff;

/// One instance as its announcement names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub id: u32,
    /// Servers it would use now (its clients' demand, capped by its pool).
    pub want: u32,
    /// Servers it holds.
    pub held: u32,
}

/// The announcement lock key of `m`.
pub fn key(m: Member) -> i64 {
    (MAGIC << 56)
        | (i64::from(m.id & 0xff_ffff) << 32)
        | (i64::from(m.want.min(FIELD_MAX)) << 16)
        | i64::from(m.held.min(FIELD_MAX))
}

/// The member an announcement key names, if it is one.
pub fn member(key: i64) -> Option<Member> {
    if key >> 56 != MAGIC {
        return None;
    }
    Some(Member {
        id: ((key >> 32) & 0xff_ffff) as u32,
        want: ((key >> 16) & 0xffff) as u32,
        held: (key & 0xffff) as u32,
    })
}

/// The query the fleet runs on one of its own idle servers: it drops the
/// announcement this backend holds (if any), takes `me`'s, and reads back,
/// in one row: the fleet's announcement keys (space-separated) among
/// backends of this role and database, the connections of the role, of
/// the database and of the server, the role's and the database's CONNECTION
/// LIMIT, max_connections less the reserved slots, and the server's clock in
/// whole seconds. Nothing in it changes what a client sees of its session
/// but the advisory lock.
pub fn query(me: Member) -> String {
    let lock = "(l.classid::int8 << 32) | l.objid::int8";
    format!(
        "/* weir-fleet id={id} held={held} want={want} */ \
         select pg_catalog.pg_advisory_unlock({lock}) from pg_catalog.pg_locks l \
         where l.pid = pg_catalog.pg_backend_pid() and l.locktype = 'advisory' and l.objsubid = 1 \
         and l.classid::int8 >> 24 = {MAGIC}; \
         select pg_catalog.pg_try_advisory_lock({key}); \
         select (select coalesce(pg_catalog.string_agg(({lock})::text, ' '), '') from pg_catalog.pg_locks l \
         join pg_catalog.pg_stat_activity a on a.pid = l.pid \
         where l.locktype = 'advisory' and l.objsubid = 1 and l.granted and l.classid::int8 >> 24 = {MAGIC} \
         and a.usename = session_user and a.datname = pg_catalog.current_database()), \
         (select count(*) from pg_catalog.pg_stat_activity where backend_type = 'client backend' and usename = session_user), \
         (select count(*) from pg_catalog.pg_stat_activity where backend_type = 'client backend' \
         and datname = pg_catalog.current_database()), \
         (select count(*) from pg_catalog.pg_stat_activity where backend_type = 'client backend'), \
         (select rolconnlimit from pg_catalog.pg_roles where rolname = session_user), \
         (select datconnlimit from pg_catalog.pg_database where datname = pg_catalog.current_database()), \
         pg_catalog.current_setting('max_connections')::int \
         - pg_catalog.current_setting('superuser_reserved_connections')::int \
         - coalesce(pg_catalog.current_setting('reserved_connections', true)::int, 0), \
         extract(epoch from pg_catalog.now())::int8",
        id = me.id,
        held = me.held,
        want = me.want,
        key = key(me),
    )
}

/// What the fleet query read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    pub members: Vec<Member>,
    pub role_conns: u32,
    pub db_conns: u32,
    pub all_conns: u32,
    /// -1: no limit.
    pub role_limit: i64,
    pub db_limit: i64,
    pub server_limit: i64,
    /// The server's clock, in seconds.
    pub epoch: i64,
}

/// The reading in the text columns of the query's last row (NULL: None).
pub fn parse(cols: &[Option<&str>]) -> Option<Reading> {
    let [keys, role, db, all, role_limit, db_limit, server_limit, epoch] = cols else { return None };
    let num = |c: &Option<&str>| c.and_then(|t| t.trim().parse::<i64>().ok());
    let mut members: Vec<Member> = Vec::new();
    for k in keys.unwrap_or("").split_whitespace() {
        let Some(m) = k.parse::<i64>().ok().and_then(member) else { continue };
        // Two announcements of one instance (it moved its lock while a
        // server held the old one): the larger figures count.
        match members.iter_mut().find(|o| o.id == m.id) {
            Some(o) => {
                o.want = o.want.max(m.want);
                o.held = o.held.max(m.held);
            }
            None => members.push(m),
        }
    }
    members.sort_by_key(|m| m.id);
    let count = |c| num(c).and_then(|n| u32::try_from(n).ok());
    Some(Reading {
        members,
        role_conns: count(role)?,
        db_conns: count(db)?,
        all_conns: count(all)?,
        role_limit: num(role_limit).unwrap_or(-1),
        db_limit: num(db_limit).unwrap_or(-1),
        server_limit: num(server_limit)?,
        epoch: num(epoch).unwrap_or(0),
    })
}

/// What the reading means for one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The servers the fleet may hold: the tightest limit, less the
    /// connections no announcing weir holds, less one slot kept free for an
    /// instance that joins while the fleet is at its limit.
    pub budget: u32,
    /// This instance's part of it.
    pub share: u32,
    /// Instances announcing.
    pub instances: u32,
    /// The fleet is at its limit: every connection the budget allows is
    /// open (the free slot excepted).
    pub at_limit: bool,
    /// Connections Postgres would still accept under the tightest limit.
    pub open: i64,
    /// Some instance wants more servers than it holds: at the limit, its
    /// demand is to reach the others (and their servers it) quickly, so the
    /// rounds run at their quickest.
    pub wanting: bool,
}

/// Judges `r` for `me` (whose own figures replace its announcement, which
/// may be a period old). None: no limit applies that the fleet could reach.
pub fn judge(r: &Reading, me: Member) -> Option<Verdict> {
    let mut members: Vec<Member> = r.members.iter().copied().filter(|m| m.id != me.id).collect();
    members.push(me);
    members.sort_by_key(|m| m.id);
    let held: i64 = members.iter().map(|m| i64::from(m.held)).sum();
    // Each limit less the connections under it that no announcing weir holds.
    let room = |limit: i64, conns: u32| (limit >= 0).then(|| limit - (i64::from(conns) - held).max(0));
    let tightest = [room(r.role_limit, r.role_conns), room(r.db_limit, r.db_conns), room(r.server_limit, r.all_conns)]
        .into_iter()
        .flatten()
        .min()?;
    let open = [(r.role_limit, r.role_conns), (r.db_limit, r.db_conns), (r.server_limit, r.all_conns)]
        .into_iter()
        .filter(|(l, _)| *l >= 0)
        .map(|(l, c)| l - i64::from(c))
        .min()?;
    let budget = u32::try_from((tightest - 1).max(0)).unwrap_or(0);
    let shares = water_fill(&members, budget, r.epoch);
    let share = members.iter().zip(&shares).find(|(m, _)| m.id == me.id).map(|(_, s)| *s).unwrap_or(0);
    let wanting = members.iter().any(|m| m.want > m.held);
    Some(Verdict { budget, share, instances: members.len() as u32, at_limit: open <= 1, open, wanting })
}

/// Splits `budget` over `members` (sorted by id): an instance wanting less
/// than an equal part gets what it wants, the rest is split equally, and
/// what does not split evenly goes one each to instances in id order,
/// starting at one that changes every two seconds of `epoch` (the server's
/// clock, the same for every instance), so that over time no instance is
/// the one always short.
pub fn water_fill(members: &[Member], budget: u32, epoch: i64) -> Vec<u32> {
    let n = members.len();
    let mut shares = vec![0u32; n];
    let mut open: Vec<usize> = (0..n).collect();
    let mut left = budget;
    // Satisfy the small wants first; each pass fixes at least one or ends.
    loop {
        if open.is_empty() {
            return shares;
        }
        let equal = left / open.len() as u32;
        let (small, big): (Vec<usize>, Vec<usize>) = open.iter().partition(|&&i| members[i].want <= equal);
        if small.is_empty() {
            break;
        }
        for i in small {
            shares[i] = members[i].want;
            left -= members[i].want;
        }
        open = big;
    }
    let equal = left / open.len() as u32;
    let mut extra = left - equal * open.len() as u32;
    let start = (epoch.div_euclid(2)).rem_euclid(open.len() as i64) as usize;
    for &i in &open {
        shares[i] = equal;
    }
    for k in 0..open.len() {
        if extra == 0 {
            break;
        }
        let i = open[(start + k) % open.len()];
        if shares[i] < members[i].want {
            shares[i] += 1;
            extra -= 1;
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: u32, want: u32, held: u32) -> Member {
        Member { id, want, held }
    }

    #[test]
    fn a_key_carries_its_member_and_others_are_not_announcements() {
        let me = m(0xabcdef, 10, 4);
        assert_eq!(member(key(me)), Some(me));
        assert_eq!(member(key(m(1, 70_000, 3))), Some(m(1, 0xffff, 3)), "capped, not wrapped");
        assert_eq!(member(42), None);
        assert_eq!(member(-1), None);
        assert!(key(m(0xff_ffff, 0xffff, 0xffff)) > 0, "the key stays a positive int8");
    }

    #[test]
    fn water_filling_gives_small_wants_theirs_and_splits_the_rest() {
        let ms = [m(1, 10, 0), m(2, 10, 0), m(3, 10, 0)];
        let mut s = water_fill(&ms, 11, 0);
        s.sort();
        assert_eq!(s, vec![3, 4, 4]);
        assert_eq!(water_fill(&[m(1, 1, 0), m(2, 10, 0), m(3, 10, 0)], 11, 0), vec![1, 5, 5]);
        assert_eq!(water_fill(&[m(1, 2, 0), m(2, 3, 0)], 11, 0), vec![2, 3], "nobody gets more than it wants");
        assert_eq!(water_fill(&[m(1, 10, 0), m(2, 10, 0)], 0, 0), vec![0, 0]);
    }

    #[test]
    fn the_odd_slot_moves_between_instances_over_time() {
        let ms = [m(1, 10, 0), m(2, 10, 0), m(3, 10, 0)];
        let short: Vec<usize> =
            (0..3).map(|t| water_fill(&ms, 11, t * 2).iter().position(|s| *s == 3).unwrap()).collect();
        let mut distinct = short.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3, "each instance is the short one in turn: {short:?}");
    }

    fn reading(members: Vec<Member>, role_conns: u32, role_limit: i64) -> Reading {
        Reading {
            members,
            role_conns,
            db_conns: role_conns,
            all_conns: role_conns + 5,
            role_limit,
            db_limit: -1,
            server_limit: 97,
            epoch: 0,
        }
    }

    #[test]
    fn the_budget_is_the_tightest_limit_less_strangers_and_one_free_slot() {
        let me = m(2, 10, 4);
        let r = reading(vec![m(1, 10, 4), m(2, 10, 1), m(3, 10, 4)], 12, 12);
        let v = judge(&r, me).unwrap();
        assert_eq!((v.budget, v.instances, v.at_limit, v.open), (11, 3, true, 0));
        assert!(v.wanting, "each wants more than it holds");
        // Two connections of the role that no weir holds.
        let v = judge(&reading(vec![m(1, 10, 4), m(3, 10, 2)], 12, 12), me).unwrap();
        assert_eq!((v.budget, v.share), (9, 3));
        // Below the limit: not at it.
        let v = judge(&reading(vec![m(1, 10, 2)], 6, 12), m(2, 10, 4)).unwrap();
        assert!(!v.at_limit);
        assert!(v.wanting);
        assert_eq!(v.open, 6);
        assert_eq!(v.share, 5, "11 over two: the odd slot is the other's at this epoch");
        let v = judge(&reading(vec![m(1, 2, 2)], 6, 12), m(2, 4, 4)).unwrap();
        assert!(!v.wanting, "each holds what it wants");
        // No role limit: max_connections less reserved is the budget.
        let v = judge(&reading(vec![], 4, -1), me).unwrap();
        assert_eq!(v.budget, 91, "97 less the 5 connections of other roles, less the free slot");
    }

    #[test]
    fn a_row_parses_and_duplicate_announcements_merge() {
        let keys = format!("{} {} {} 17", key(m(5, 10, 3)), key(m(2, 4, 4)), key(m(5, 9, 4)));
        let cols = [
            Some(keys.as_str()),
            Some("12"),
            Some("12"),
            Some("20"),
            Some("12"),
            Some("-1"),
            Some("97"),
            Some("1700000000"),
        ];
        let r = parse(&cols).unwrap();
        assert_eq!(r.members, vec![m(2, 4, 4), m(5, 10, 4)]);
        assert_eq!((r.role_conns, r.db_limit, r.server_limit, r.epoch), (12, -1, 97, 1_700_000_000));
        let empty = [Some(""), Some("0"), Some("0"), Some("3"), None, None, Some("97"), Some("0")];
        assert_eq!(parse(&empty).unwrap().role_limit, -1);
        assert!(parse(&cols[..7]).is_none(), "a short row is no reading");
    }

    #[test]
    fn the_query_announces_itself_first() {
        let q = query(m(7, 10, 3));
        assert!(q.starts_with("/* weir-fleet id=7 held=3 want=10 */"), "{q}");
        assert!(q.contains(&key(m(7, 10, 3)).to_string()));
    }
}
