package meta

import (
	"context"
	"errors"

	"github.com/walcast/walcast/api/walcastv1"
)

// consolePage is how many import jobs or collections the operator console
// shows a page.
const consolePage = 100

// ImportJobs lists one page of import jobs, by id, for the operator
// console's imports page (app.ImportJobLister): the first, or the one
// after token.
func (a *App) ImportJobs(ctx context.Context, token string) ([]*walcastv1.ImportJob, string, error) {
	ss := a.Services()
	if len(ss) == 0 {
		return nil, "", errors.New("meta: the service is not running")
	}
	resp, err := ss[0].ListImportJobs(ctx, &walcastv1.ListImportJobsRequest{Limit: consolePage, PageToken: token})
	if err != nil {
		return nil, "", err
	}
	return resp.GetJobs(), resp.GetNextPageToken(), nil
}

// Collections lists one page of the collections of a database, by name,
// for the operator console's collections page (app.CollectionLister): the
// first, or the one after token.
func (a *App) Collections(ctx context.Context, database, token string) ([]*walcastv1.Collection, string, error) {
	ss := a.Services()
	if len(ss) == 0 {
		return nil, "", errors.New("meta: the service is not running")
	}
	resp, err := ss[0].ListCollections(ctx, &walcastv1.ListCollectionsRequest{Database: database, Limit: consolePage, PageToken: token})
	if err != nil {
		return nil, "", err
	}
	return resp.GetCollections(), resp.GetNextPageToken(), nil
}
