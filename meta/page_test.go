package meta

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
)

// TestR10_1_ListsPage: ListDatabases, ListCollections and ListImportJobs
// page: each page holds at most its limit, in order (names, ids), the
// next_page_token leads to the next page until the last has none, every
// item comes once, and a limit of 0 is the server's page; a token of
// another list, a garbage one or a negative limit is InvalidArgument.
func TestR10_1_ListsPage(t *testing.T) {
	e, ctx := importEnv(t)
	const colls = 23
	names := []string{"c"}
	for i := range colls - 1 {
		n := fmt.Sprintf("k%02d", i)
		e.createColl(ctx, n)
		names = append(names, n)
	}
	slices.Sort(names)
	for i := range 4 {
		must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: fmt.Sprintf("more%d", i)}))
	}
	e.pauseImporter()
	var jobIDs []uint64
	for i := range 7 {
		r := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, names[i%colls], key()))
		jobIDs = append(jobIDs, r.Job.Id)
	}
	slices.Sort(jobIDs)

	for _, limit := range []int32{1, 5, 23, 0} {
		var got []string
		token, pages := "", 0
		for {
			r := must[*walcastv1.ListCollectionsResponse](t)(e.c.ListCollectionsPage(ctx,
				&walcastv1.ListCollectionsRequest{Database: "db", Limit: limit, PageToken: token}))
			pages++
			if limit > 0 && len(r.Collections) > int(limit) {
				t.Fatalf("limit %d: a page of %d", limit, len(r.Collections))
			}
			for _, c := range r.Collections {
				if c.Database != "db" || len(c.Vchannels) == 0 {
					t.Fatalf("limit %d: listed %v", limit, c)
				}
				got = append(got, c.Name)
			}
			if token = r.NextPageToken; token == "" {
				break
			}
		}
		if !slices.Equal(got, names) {
			t.Fatalf("limit %d: listed %v, want %v", limit, got, names)
		}
		if want := (colls + int(max(limit, 1)) - 1) / int(max(limit, 1)); limit > 0 && pages != want && pages != want+1 {
			t.Errorf("limit %d: %d pages for %d collections", limit, pages, colls)
		}
	}

	var dbs []string
	for token := ""; ; {
		r := must[*walcastv1.ListDatabasesResponse](t)(e.c.ListDatabasesPage(ctx, &walcastv1.ListDatabasesRequest{Limit: 2, PageToken: token}))
		for _, d := range r.Databases {
			dbs = append(dbs, d.Name)
		}
		if token = r.NextPageToken; token == "" {
			break
		}
	}
	if want := []string{"db", "more0", "more1", "more2", "more3"}; !slices.Equal(dbs, want) {
		t.Errorf("databases %v, want %v", dbs, want)
	}

	var jobs []uint64
	var jobToken string
	for token := ""; ; {
		r := must[*walcastv1.ListImportJobsResponse](t)(e.c.ListImportJobsPage(ctx, &walcastv1.ListImportJobsRequest{Limit: 3, PageToken: token}))
		if len(r.Jobs) > 3 {
			t.Fatalf("a page of %d jobs", len(r.Jobs))
		}
		for _, j := range r.Jobs {
			jobs = append(jobs, j.Id)
		}
		if token = r.NextPageToken; token == "" {
			break
		}
		jobToken = token
	}
	if !slices.Equal(jobs, jobIDs) {
		t.Errorf("jobs %v, want %v", jobs, jobIDs)
	}
	all := must[[]*walcastv1.ImportJob](t)(e.c.ListImportJobs(ctx, "db", names[0]))
	if len(all) != 1 || all[0].Collection != names[0] {
		t.Errorf("jobs of db.%s: %v", names[0], all)
	}

	collToken := must[*walcastv1.ListCollectionsResponse](t)(e.c.ListCollectionsPage(ctx,
		&walcastv1.ListCollectionsRequest{Database: "db", Limit: 1})).NextPageToken
	for _, tc := range []struct {
		name string
		call func(context.Context) error
	}{
		{"negative limit", func(ctx context.Context) error {
			_, err := e.c.ListCollectionsPage(ctx, &walcastv1.ListCollectionsRequest{Database: "db", Limit: -1})
			return err
		}},
		{"a job token for collections", func(ctx context.Context) error {
			_, err := e.c.ListCollectionsPage(ctx, &walcastv1.ListCollectionsRequest{Database: "db", PageToken: jobToken})
			return err
		}},
		{"a collection token for jobs", func(ctx context.Context) error {
			_, err := e.c.ListImportJobsPage(ctx, &walcastv1.ListImportJobsRequest{PageToken: collToken})
			return err
		}},
		{"a garbage token", func(ctx context.Context) error {
			_, err := e.c.ListDatabasesPage(ctx, &walcastv1.ListDatabasesRequest{PageToken: "not a token!"})
			return err
		}},
		{"a token that is no name", func(ctx context.Context) error {
			_, err := e.c.ListCollectionsPage(ctx, &walcastv1.ListCollectionsRequest{Database: "db", PageToken: pageToken(pageCollections, "a/b")})
			return err
		}},
	} {
		wantCode(t, tc.call(ctx), connect.CodeInvalidArgument)
	}
}

// TestR10_1_ListsPageThroughInserts: a client paging through more items
// than one page while others are created between its pages (before and
// after its cursor) sees every item that existed throughout exactly once,
// in order, and no item twice; so do users, whose pages carry the grants
// of their users and no others.
func TestR10_1_ListsPageThroughInserts(t *testing.T) {
	e, ctx := importEnv(t)
	throughout := []string{"c"}
	for i := range 9 {
		n := fmt.Sprintf("m%d", i)
		e.createColl(ctx, n)
		throughout = append(throughout, n)
	}
	slices.Sort(throughout)
	var got []string
	token, pages := "", 0
	for {
		r := must[*walcastv1.ListCollectionsResponse](t)(e.c.ListCollectionsPage(ctx,
			&walcastv1.ListCollectionsRequest{Database: "db", Limit: 3, PageToken: token}))
		pages++
		for _, c := range r.Collections {
			got = append(got, c.Name)
		}
		if token = r.NextPageToken; token == "" {
			break
		}
		// One before the cursor (the client has passed its place), one
		// after it (it may or may not come).
		e.createColl(ctx, fmt.Sprintf("a%d", pages))
		e.createColl(ctx, fmt.Sprintf("z%d", pages))
	}
	if pages < 4 {
		t.Fatalf("%d pages of 3 for %d collections", pages, len(throughout))
	}
	if !slices.IsSorted(got) {
		t.Errorf("listed out of order: %v", got)
	}
	if c := slices.Compact(slices.Clone(got)); len(c) != len(got) {
		t.Errorf("listed an item twice: %v", got)
	}
	for _, n := range throughout {
		if !slices.Contains(got, n) {
			t.Errorf("%s existed throughout, not listed: %v", n, got)
		}
	}

	var users []string
	grants := map[string]int{}
	token = ""
	for i := 0; ; i++ {
		if i < 5 {
			u := fmt.Sprintf("u%d", i)
			must[*walcastv1.CreateUserResponse](t)(e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: u}))
			must[*walcastv1.GrantPrivilegeResponse](t)(e.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{
				Grant: &walcastv1.Grant{User: u, Privilege: "Query", Database: "db", Collection: "c"}}))
			if i < 4 {
				continue
			}
		}
		r := must[*walcastv1.ListUsersResponse](t)(e.c.ListUsersPage(ctx, &walcastv1.ListUsersRequest{Limit: 2, PageToken: token}))
		if len(r.Users) > 2 {
			t.Fatalf("a page of %d users", len(r.Users))
		}
		for _, u := range r.Users {
			users = append(users, u.Name)
		}
		for _, g := range r.Grants {
			if !slices.ContainsFunc(r.Users, func(u *walcastv1.User) bool { return u.Name == g.User }) {
				t.Errorf("a page of users %v shows a grant of %s", r.Users, g.User)
			}
			grants[g.User]++
		}
		if token = r.NextPageToken; token == "" {
			break
		}
		u := fmt.Sprintf("v%d", i)
		must[*walcastv1.CreateUserResponse](t)(e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: u}))
	}
	for i := range 5 {
		if u := fmt.Sprintf("u%d", i); !slices.Contains(users, u) || grants[u] != 1 {
			t.Errorf("user %s: listed %v, %d grants", u, users, grants[u])
		}
	}
	if c := slices.Compact(slices.Clone(users)); len(c) != len(users) || !slices.IsSorted(users) {
		t.Errorf("users %v: not once each, by name", users)
	}
	all := must[*walcastv1.ListUsersResponse](t)(e.c.ListUsers(ctx))
	if len(all.Users) < 5 || len(all.Grants) != 5 {
		t.Errorf("ListUsers gathered %d users, %d grants", len(all.Users), len(all.Grants))
	}
	for _, tc := range []struct {
		name, token string
		limit       int32
	}{
		{"negative limit", "", -1},
		{"a collection token", collToken(ctx, t, e), 0},
		{"a garbage token", "not a token!", 0},
		{"a token that is no name", pageToken(pageUsers, "a/b"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.c.ListUsersPage(ctx, &walcastv1.ListUsersRequest{Limit: tc.limit, PageToken: tc.token})
			wantCode(t, err, connect.CodeInvalidArgument)
		})
	}
}

// collToken is the token of the second page of db's collections.
func collToken(ctx context.Context, t *testing.T, e *env) string {
	t.Helper()
	return must[*walcastv1.ListCollectionsResponse](t)(e.c.ListCollectionsPage(ctx,
		&walcastv1.ListCollectionsRequest{Database: "db", Limit: 1})).NextPageToken
}
