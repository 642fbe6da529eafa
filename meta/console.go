package meta

import (
	"context"
	"errors"

	"github.com/walcast/walcast/api/walcastv1"
)

// ImportJobs lists every import job, by id, for the operator console's
// imports page (app.ImportJobLister).
func (a *App) ImportJobs(ctx context.Context) ([]*walcastv1.ImportJob, error) {
	ss := a.Services()
	if len(ss) == 0 {
		return nil, errors.New("meta: the service is not running")
	}
	resp, err := ss[0].ListImportJobs(ctx, &walcastv1.ListImportJobsRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetJobs(), nil
}
