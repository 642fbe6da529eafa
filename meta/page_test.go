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
