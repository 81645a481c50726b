package debezium

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ConnectorStatus is Kafka Connect's GET /connectors/{name}/status: what the
// test harness and the benchmark wait on while a Debezium connector starts.
type ConnectorStatus struct {
	Connector struct {
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"connector"`
	Tasks []struct {
		ID    int    `json:"id"`
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"tasks"`
}

// GetConnectorStatus asks the Connect REST server at baseURL for connector
// name's status. A 404 (the worker has not created the connector yet) is an
// error like any other status but 200.
func GetConnectorStatus(ctx context.Context, client *http.Client, baseURL, name string) (ConnectorStatus, error) {
	var st ConnectorStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/connectors/"+name+"/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, fmt.Errorf("get status: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, fmt.Errorf("get status: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("get status: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("decode status %q: %w", body, err)
	}
	return st, nil
}

// Running reports whether the connector and every task run (and there is one).
func (s ConnectorStatus) Running() bool {
	if s.Connector.State != "RUNNING" || len(s.Tasks) == 0 {
		return false
	}
	for _, task := range s.Tasks {
		if task.State != "RUNNING" {
			return false
		}
	}
	return true
}

// Failed reports a FAILED connector or task with its Java stack trace (all
// of it when full, else its first line): a bad property or a missing
// privilege never recovers, so waiting longer is pointless.
func (s ConnectorStatus) Failed(full bool) error {
	trace := func(t string) string {
		if !full {
			t, _, _ = strings.Cut(t, "\n")
		}
		return t
	}
	if s.Connector.State == "FAILED" {
		return fmt.Errorf("connector FAILED: %s", trace(s.Connector.Trace))
	}
	for _, task := range s.Tasks {
		if task.State == "FAILED" {
			return fmt.Errorf("task %d FAILED: %s", task.ID, trace(task.Trace))
		}
	}
	return nil
}

func (s ConnectorStatus) String() string {
	var b strings.Builder
	state := s.Connector.State
	if state == "" {
		state = "(none)"
	}
	fmt.Fprintf(&b, "connector %s", state)
	for _, task := range s.Tasks {
		fmt.Fprintf(&b, ", task %d %s", task.ID, task.State)
	}
	if len(s.Tasks) == 0 {
		b.WriteString(", no task yet")
	}
	return b.String()
}
