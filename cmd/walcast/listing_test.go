package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/walcast/walcast/api/walcastv1"
)

// TestR10_1_ListsStreamTheGatheredDocument: a paged list command writes
// each page as it arrives, and what it writes is, byte for byte, the
// document the gathered list was (-o json, -o yaml: {"<items>": [...],
// "next_page_token": ...}), with or without items and a token; a table
// has its header once, whatever the pages.
func TestR10_1_ListsStreamTheGatheredDocument(t *testing.T) {
	dbs := make([]*walcastv1.Database, 5)
	for i := range dbs {
		dbs[i] = &walcastv1.Database{Id: uint64(i + 1), Name: fmt.Sprintf("d<%d>", i), CreatedAt: at}
	}
	for _, f := range []format{formatJSON, formatYAML, formatTable} {
		for _, tc := range []struct {
			pages [][]*walcastv1.Database
			next  string
		}{
			{nil, ""},
			{[][]*walcastv1.Database{dbs[:2], dbs[2:4], dbs[4:]}, ""},
			{[][]*walcastv1.Database{dbs[:1], nil}, "tok&\"en"},
			{[][]*walcastv1.Database{dbs}, "t"},
		} {
			var streamed bytes.Buffer
			lw := &listWriter{w: &streamed, f: f, key: "databases", header: []string{"ID", "NAME"}}
			var all []*walcastv1.Database
			for _, p := range tc.pages {
				for _, d := range p {
					if err := lw.item(d, []string{fmt.Sprint(d.GetId()), d.GetName()}); err != nil {
						t.Fatal(err)
					}
				}
				if err := lw.flushPage(); err != nil {
					t.Fatal(err)
				}
				all = append(all, p...)
			}
			if err := lw.end(tc.next); err != nil {
				t.Fatal(err)
			}
			var gathered bytes.Buffer
			if f == formatTable {
				tb := newTable(&gathered, "ID", "NAME")
				for _, d := range all {
					tb.row(fmt.Sprint(d.GetId()), d.GetName())
				}
				if err := morePages(&gathered, tb, tc.next); err != nil {
					t.Fatal(err)
				}
				if n := strings.Count(streamed.String(), "ID  "); n != 1 {
					t.Errorf("%s: the header %d times:\n%s", f, n, streamed.String())
				}
			} else if err := emit(&gathered, f, protoValue(&walcastv1.ListDatabasesResponse{Databases: all, NextPageToken: tc.next})); err != nil {
				t.Fatal(err)
			}
			got, want := streamed.String(), gathered.String()
			if f == formatTable { // aligned page by page
				got, want = squash(got), squash(want)
			}
			if got != want {
				t.Errorf("%s, %d pages, next %q: streamed\n%s\nwant\n%s", f, len(tc.pages), tc.next, streamed.String(), gathered.String())
			}
		}
	}
}

// TestR10_1_TasksAndUsersStreamTheGatheredDocument: tasks list and user
// list, whose documents have their items first and then the cursor of the
// rest, write page by page, byte for byte, the document the gathered list
// is (tasks list's taskList.value; user list's users, each with its
// grants, and next_page_token), with or without items and a cursor.
func TestR10_1_TasksAndUsersStreamTheGatheredDocument(t *testing.T) {
	tasks := make([]*walcastv1.Task, 5)
	for i := range tasks {
		tasks[i] = goldenTask()
		tasks[i].Id = uint64(10 - i)
	}
	users := make([]*walcastv1.User, 4)
	grants := map[string][]*walcastv1.Grant{}
	for i := range users {
		users[i] = &walcastv1.User{Name: fmt.Sprintf("u<%d>", i), CreatedAt: at}
		for j := range i {
			grants[users[i].GetName()] = append(grants[users[i].GetName()], &walcastv1.Grant{User: users[i].GetName(), Privilege: "Search", Database: fmt.Sprint("db&", j), Collection: "*"})
		}
	}
	for _, f := range []format{formatJSON, formatYAML} {
		for _, tc := range []struct {
			pages  []int // items per page
			more   bool
			oldest bool
		}{
			{nil, false, false},
			{[]int{2, 2, 1}, false, false},
			{[]int{1, 0}, true, true},
			{[]int{4}, true, false},
		} {
			var streamed bytes.Buffer
			lw := &listWriter{w: &streamed, f: f, key: "tasks"}
			l := &taskList{oldest: tc.oldest, more: tc.more}
			i := 0
			for _, n := range tc.pages {
				for _, task := range tasks[i : i+n] {
					if err := lw.item(task, nil); err != nil {
						t.Fatal(err)
					}
					l.tasks = append(l.tasks, task)
					l.cursor = task.GetId()
				}
				i += n
			}
			if err := lw.endWith(l.tail(), ""); err != nil {
				t.Fatal(err)
			}
			var gathered bytes.Buffer
			if err := emit(&gathered, f, l.value()); err != nil {
				t.Fatal(err)
			}
			if streamed.String() != gathered.String() {
				t.Errorf("tasks %s, pages %v, more %v: streamed\n%s\nwant\n%s", f, tc.pages, tc.more, streamed.String(), gathered.String())
			}

			streamed.Reset()
			lw = &listWriter{w: &streamed, f: f, key: "users"}
			var all []any
			i = 0
			for _, n := range tc.pages {
				for _, u := range users[i:min(i+n, len(users))] {
					v := userValue(u, grants[u.GetName()])
					if err := lw.item(v, nil); err != nil {
						t.Fatal(err)
					}
					all = append(all, userValue(u, grants[u.GetName()]))
				}
				i += n
			}
			next := map[bool]string{true: "tok&en"}[tc.more]
			if err := lw.end(next); err != nil {
				t.Fatal(err)
			}
			gathered.Reset()
			if all == nil {
				all = []any{}
			}
			if err := emit(&gathered, f, ordered{{"users", all}, {"next_page_token", next}}); err != nil {
				t.Fatal(err)
			}
			if streamed.String() != gathered.String() {
				t.Errorf("users %s, pages %v, next %q: streamed\n%s\nwant\n%s", f, tc.pages, next, streamed.String(), gathered.String())
			}
		}
	}
}

// squash is a table's text with each run of blanks one space.
func squash(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString(strings.Join(strings.Fields(line), " ") + "\n")
	}
	return b.String()
}

// TestR9_5_CompletionStopsAtItsBound: completing databases or collections
// stops reading the list once it has maxCompletions names, however long
// the list (a million collections are not read to complete one), and
// returns what it read with the list's error.
func TestR9_5_CompletionStopsAtItsBound(t *testing.T) {
	pulled := 0
	endless := func(yield func(*walcastv1.Collection, error) bool) {
		for i := 0; ; i++ {
			pulled++
			if !yield(&walcastv1.Collection{Name: fmt.Sprintf("c%07d", i)}, nil) {
				return
			}
		}
	}
	names, err := firstNames(endless, (*walcastv1.Collection).GetName)
	if err != nil || len(names) != maxCompletions || pulled != maxCompletions || names[0] != "c0000000" {
		t.Fatalf("%d names (%d read), first %q, %v", len(names), pulled, names[0], err)
	}
	failing := func(yield func(*walcastv1.Collection, error) bool) {
		if yield(&walcastv1.Collection{Name: "a"}, nil) {
			yield(nil, errors.New("gone"))
		}
	}
	if names, err := firstNames(failing, (*walcastv1.Collection).GetName); err == nil || len(names) != 1 {
		t.Fatalf("a failing list: %v, %v", names, err)
	}
}
