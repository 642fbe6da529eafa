package meta

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/catalog"
)

// Lists page (ListDatabases, ListCollections, ListImportJobs, ListUsers): a request
// asks for at most limit items after its page_token, and a response that
// stops before the end says where to go on (next_page_token). A page reads
// what it shows and the index entries that lead to it, never every record
// of its kind, so that a list costs the same at a million collections as
// at ten, and no response is built whole in memory.
//
// A token is opaque to clients: base64 of the list's kind and the last
// item's name or id, so that a token of one list is refused by another.

// pageReq is a list request's page: at most n items after after ("": from
// the first).
type pageReq struct {
	n     int
	after string
}

// pageArgs checks a list request's limit and page token; kind names the
// list the token must be of.
func pageArgs(kind string, limit int32, token string) (pageReq, error) {
	switch {
	case limit < 0:
		return pageReq{}, errorf(ErrInvalidArgument, "limit %d is negative", limit)
	case limit == 0 || limit > MaxListPage:
		limit = MaxListPage
	}
	p := pageReq{n: int(limit)}
	if token == "" {
		return p, nil
	}
	bad := errorf(ErrInvalidArgument, "page_token %q is not a token of this list", printable(token))
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return p, bad
	}
	k, after, ok := strings.Cut(string(raw), ":")
	if !ok || k != kind || after == "" {
		return p, bad
	}
	p.after = after
	return p, nil
}

// pageToken is the token of the page after the item last.
func pageToken(kind, last string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(kind + ":" + last))
}

// Token kinds.
const (
	pageDatabases   = "db"
	pageCollections = "coll"
	pageJobs        = "job"
	pageUsers       = "user"
)

// nameIDs reads one page of a name index (prefix + name → id): the names
// after p.after, by name, and whether more follow.
func nameIDs(ctx context.Context, r reader, prefix string, p pageReq) (names []string, ids []uint64, more bool, err error) {
	more, err = namePage(ctx, r, prefix, p, func(key string, raw []byte) error {
		id, err := nameValueID(key, raw)
		if err != nil {
			return err
		}
		names, ids = append(names, strings.TrimPrefix(key, prefix)), append(ids, id)
		return nil
	})
	return names, ids, more, err
}

// namePage calls fn with each name under prefix (key and value, the value
// fn's only during the call) of the page p asks for, in name order, and
// reports whether more follow.
func namePage(ctx context.Context, r reader, prefix string, p pageReq, fn func(key string, raw []byte) error) (more bool, err error) {
	if p.after != "" {
		if err := checkName("page_token", p.after); err != nil {
			return false, errorf(ErrInvalidArgument, "page_token is not a token of this list")
		}
	}
	more, err = catalog.Page(ctx, r.cat, prefix, p.after, p.n, fn)
	if err != nil {
		return false, listErr(prefix, err)
	}
	return more, nil
}

// ListDatabases lists the databases by name, one page at a time.
func (s *Service) ListDatabases(ctx context.Context, req *walcastv1.ListDatabasesRequest) (*walcastv1.ListDatabasesResponse, error) {
	p, err := pageArgs(pageDatabases, req.GetLimit(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	_, r, err := s.current()
	if err != nil {
		return nil, err
	}
	names, ids, more, err := nameIDs(ctx, r, prefixDBName, p)
	if err != nil {
		return nil, err
	}
	out := &walcastv1.ListDatabasesResponse{}
	for _, id := range ids {
		var d dbRecord
		ok, err := r.get(ctx, dbKey(id), &d)
		if err != nil {
			return nil, err
		}
		if ok { // else dropped since its name was read
			out.Databases = append(out.Databases, d.pb())
		}
	}
	if more {
		out.NextPageToken = pageToken(pageDatabases, names[len(names)-1])
	}
	return out, nil
}

// ListCollections lists the collections of a database by name, one page at
// a time: the page's entries of the database's name index, then each
// collection's record and indexes.
func (s *Service) ListCollections(ctx context.Context, req *walcastv1.ListCollectionsRequest) (*walcastv1.ListCollectionsResponse, error) {
	db := req.GetDatabase()
	if err := checkName("database", db); err != nil {
		return nil, err
	}
	p, err := pageArgs(pageCollections, req.GetLimit(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	_, r, err := s.current()
	if err != nil {
		return nil, err
	}
	dbID, err := resolveDB(ctx, r, db)
	if err != nil {
		return nil, err
	}
	// A page is one read of the names, which hold the records; a name of
	// the layout before one key per collection holds an id, whose record
	// is read after.
	prefix := collNamesPrefix(dbID)
	var last string
	var colls []collRecord
	var ids []uint64 // of the old layout: its records to read
	var at []int     // where each goes in colls
	more, err := namePage(ctx, r, prefix, p, func(key string, raw []byte) error {
		last = strings.TrimPrefix(key, prefix)
		var c collRecord
		if len(raw) > 0 && raw[0] == '{' {
			if err := r.collValue(ctx, key, raw, &c); err != nil {
				return err
			}
			colls = append(colls, c)
			return nil
		}
		id, err := nameValueID(key, raw)
		if err != nil {
			return err
		}
		ids, at, colls = append(ids, id), append(at, len(colls)), append(colls, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, id := range ids {
		ok, err := r.get(ctx, collKey(id), &colls[at[i]])
		if err != nil {
			return nil, err
		}
		if !ok {
			colls[at[i]].ID = 0 // dropped since its name was read
		}
	}
	out := &walcastv1.ListCollectionsResponse{}
	for _, c := range colls {
		if c.ID == 0 {
			continue
		}
		pc, err := withIndexes(ctx, r, c)
		if err != nil {
			return nil, err
		}
		out.Collections = append(out.Collections, pc)
	}
	if more {
		out.NextPageToken = pageToken(pageCollections, last)
	}
	return out, nil
}

// ListImportJobs lists the import jobs by id, one page at a time: all of
// them, those of a database, or those of a collection (by its current
// name). Each shows its collection's current name and its progress (see
// jobView).
func (s *Service) ListImportJobs(ctx context.Context, req *walcastv1.ListImportJobsRequest) (*walcastv1.ListImportJobsResponse, error) {
	db, coll := req.GetDatabase(), req.GetCollection()
	if coll != "" && db == "" {
		return nil, errorf(ErrInvalidArgument, "a collection needs its database")
	}
	p, err := pageArgs(pageJobs, req.GetLimit(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	var after uint64
	if p.after != "" {
		if after, err = strconv.ParseUint(p.after, 10, 64); err != nil {
			return nil, errorf(ErrInvalidArgument, "page_token is not a token of this list")
		}
	}
	_, r, err := s.current()
	if err != nil {
		return nil, err
	}
	keep := func(jobRecord) bool { return true }
	switch {
	case coll != "":
		if err := errors.Join(checkName("database", db), checkName("collection", coll)); err != nil {
			return nil, err
		}
		_, collID, err := resolveColl(ctx, r, db, coll)
		if err != nil {
			return nil, err
		}
		keep = func(j jobRecord) bool { return j.CollectionID == collID }
	case db != "":
		if err := checkName("database", db); err != nil {
			return nil, err
		}
		dbID, err := resolveDB(ctx, r, db)
		if err != nil {
			return nil, err
		}
		keep = func(j jobRecord) bool { return j.DatabaseID == dbID }
	}
	jobs, more, err := jobPage(ctx, r, after, p.n, keep)
	if err != nil {
		return nil, err
	}
	out := &walcastv1.ListImportJobsResponse{}
	for _, j := range jobs {
		out.Jobs = append(out.Jobs, j.pb())
	}
	if more {
		out.NextPageToken = pageToken(pageJobs, idStr(jobs[len(jobs)-1].ID))
	}
	return out, nil
}

// jobPage returns the n jobs with the lowest ids above after that keep
// takes, as the API shows them (jobView), and whether more follow. Job keys
// hold their ids in decimal, which key order does not sort, so the page is
// chosen while the job records stream by: it keeps the n+1 lowest ids, not
// every job. Only the page's collections and progress are read.
func jobPage(ctx context.Context, r reader, after uint64, n int, keep func(jobRecord) bool) ([]jobRecord, bool, error) {
	var h jobHeap // the n+1 lowest ids so far, highest on top
	err := r.cat.List(ctx, prefixImportJob, func(key string, raw []byte) error {
		var j jobRecord
		if err := json.Unmarshal(raw, &j); err != nil {
			return errorf(ErrCorruptMetadata, "%s: %v", key, err)
		}
		if j.ID <= after || !keep(j) {
			return nil
		}
		if len(h) <= n {
			heap.Push(&h, j)
		} else if j.ID < h[0].ID {
			h[0] = j
			heap.Fix(&h, 0)
		}
		return nil
	})
	if err != nil {
		return nil, false, listErr(prefixImportJob, err)
	}
	jobs := []jobRecord(h)
	sortJobs(jobs)
	more := len(jobs) > n
	if more {
		jobs = jobs[:n]
	}
	colls := map[uint64]collRecord{}
	for i, j := range jobs {
		c, seen := colls[j.CollectionID]
		if !seen {
			var alive bool
			var err error
			c, alive, err = r.collByID(ctx, j.DatabaseID, j.Collection, j.CollectionID)
			if err != nil {
				return nil, false, err
			}
			if !alive {
				c.ID = 0
			}
			colls[j.CollectionID] = c
		}
		var pr progressRecord
		started, err := r.get(ctx, progressKey(j.ID), &pr)
		if err != nil {
			return nil, false, err
		}
		if started {
			jobs[i] = jobView(j, &pr, c)
		} else {
			jobs[i] = jobView(j, nil, c)
		}
	}
	return jobs, more, nil
}

func sortJobs(jobs []jobRecord) {
	slices.SortFunc(jobs, func(a, b jobRecord) int { return cmp.Compare(a.ID, b.ID) })
}

// jobHeap is a max-heap of jobs by id.
type jobHeap []jobRecord

func (h jobHeap) Len() int           { return len(h) }
func (h jobHeap) Less(i, j int) bool { return h[i].ID > h[j].ID }
func (h jobHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *jobHeap) Push(x any)        { *h = append(*h, x.(jobRecord)) }
func (h *jobHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// ListUsers lists the users by name, one page at a time, with the grants
// of the page's users (each user's grants are read under its own prefix,
// not every grant).
func (s *Service) ListUsers(ctx context.Context, req *walcastv1.ListUsersRequest) (*walcastv1.ListUsersResponse, error) {
	p, err := pageArgs(pageUsers, req.GetLimit(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if p.after != "" {
		if err := checkName("page_token", p.after); err != nil {
			return nil, errorf(ErrInvalidArgument, "page_token is not a token of this list")
		}
	}
	_, r, err := s.current()
	if err != nil {
		return nil, err
	}
	var users []userRecord
	more, err := catalog.Page(ctx, r.cat, prefixUser, p.after, p.n, func(key string, raw []byte) error {
		var u userRecord
		if err := json.Unmarshal(raw, &u); err != nil {
			return errorf(ErrCorruptMetadata, "%s: %v", key, err)
		}
		users = append(users, u)
		return nil
	})
	if err != nil {
		return nil, listErr(prefixUser, err)
	}
	out := &walcastv1.ListUsersResponse{}
	for _, u := range users {
		out.Users = append(out.Users, u.pb())
		grants, err := list[grantRecord](ctx, r, grantsOfUser(u.Name))
		if err != nil {
			return nil, err
		}
		for _, g := range grants {
			out.Grants = append(out.Grants, g.pb())
		}
	}
	if more {
		out.NextPageToken = pageToken(pageUsers, users[len(users)-1].Name)
	}
	return out, nil
}
