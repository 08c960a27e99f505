package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// ResetParams is the body of POST /api/offsets/reset: the flags of `kafkatx offsets reset`.
// Exactly one target: to_offset, to_time (RFC 3339), to_earliest, to_latest or to_database.
type ResetParams struct {
	Group string `json:"group"`
	Topic string `json:"topic"`
	// Partition limits the reset to one partition (default: every partition of the topic).
	Partition  *int32 `json:"partition,omitempty"`
	ToOffset   *int64 `json:"to_offset,omitempty"`
	ToTime     string `json:"to_time,omitempty"`
	ToEarliest bool   `json:"to_earliest,omitempty"`
	ToLatest   bool   `json:"to_latest,omitempty"`
	ToDatabase bool   `json:"to_database,omitempty"`
	// Mode is skip or replay (not with to_database).
	Mode   string `json:"mode,omitempty"`
	Reason string `json:"reason"`
	// DryRun answers the plan and changes nothing.
	DryRun bool `json:"dry_run"`
}

// request checks p as the CLI's OffsetsResetCmd.Validate does and builds the request.
func (p ResetParams) request(actor string) (offsets.ResetRequest, error) {
	req := offsets.ResetRequest{Group: p.Group, Topic: p.Topic, Partition: -1, Mode: offsets.Mode(p.Mode), Reason: p.Reason, Actor: actor}
	if p.Group == "" || p.Topic == "" {
		return req, errors.New("group and topic are required")
	}
	if strings.TrimSpace(p.Reason) == "" {
		return req, errors.New("reason is required: say why, for the audit trail")
	}
	if p.Partition != nil {
		if *p.Partition < 0 {
			return req, fmt.Errorf("partition %d: want 0 or more", *p.Partition)
		}
		req.Partition = *p.Partition
	}
	n := 0
	for _, set := range []bool{p.ToOffset != nil, p.ToTime != "", p.ToEarliest, p.ToLatest, p.ToDatabase} {
		if set {
			n++
		}
	}
	if n != 1 {
		return req, errors.New("exactly one target is required: to_offset, to_time, to_earliest, to_latest or to_database")
	}
	switch {
	case p.ToDatabase && p.Mode != "":
		return req, errors.New("mode does not apply to to_database, which moves only Kafka")
	case !p.ToDatabase && p.Mode != string(offsets.ModeSkip) && p.Mode != string(offsets.ModeReplay):
		return req, errors.New("mode skip or replay is required (except with to_database)")
	}
	t, err := offsets.TargetFrom(p.ToOffset, p.ToTime, p.ToEarliest, p.ToLatest)
	if err != nil {
		return req, fmt.Errorf("to_time: %w", err)
	}
	req.Target = t
	return req, nil
}

// ResetStep is one partition of a reset plan.
type ResetStep struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Watermark int64  `json:"watermark"`
	Committed int64  `json:"committed"` // -1 when none
	Target    int64  `json:"target"`
	// Action is operator_skip, replay, align or none.
	Action   string `json:"action"`
	Messages int64  `json:"messages"`
	Note     string `json:"note,omitempty"`
	AuditID  int64  `json:"audit_id,omitempty"`
	Done     string `json:"done,omitempty"`
}

// ResetResult answers POST /api/offsets/reset.
type ResetResult struct {
	Group  string      `json:"group"`
	Topic  string      `json:"topic"`
	Target string      `json:"target"`
	Mode   string      `json:"mode,omitempty"`
	Reason string      `json:"reason"`
	Actor  string      `json:"actor"`
	DryRun bool        `json:"dry_run"`
	Steps  []ResetStep `json:"steps"`
	// GroupState and Members are the broker's view of the group; Refused says why nothing
	// was done (active members: 409).
	GroupState string   `json:"group_state"`
	Members    []string `json:"members,omitempty"`
	Refused    string   `json:"refused,omitempty"`
	// Executed is true when the plan was applied; Error says what stopped it half way.
	Executed bool   `json:"executed"`
	Error    string `json:"error,omitempty"`
}

// reset runs `kafkatx offsets reset`'s code path: plan, refuse while the group has active
// members, execute unless a dry run. The error is for a request that cannot be planned.
func (h *Handler) reset(ctx context.Context, p ResetParams, actor string) (*ResetResult, int, error) {
	req, err := p.request(actor)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	if h.cfg.Shards != nil {
		return nil, http.StatusConflict, errors.New("this console reads a sharded service: reset offsets with kafkatx offsets reset and the same --shard flags, which acts on the shard that holds the partition")
	}
	plan, err := h.op.PlanReset(ctx, req)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	res := &ResetResult{Group: req.Group, Topic: req.Topic, Target: req.Target.String(), Mode: string(req.Mode), Reason: req.Reason,
		Actor: actor, DryRun: p.DryRun, GroupState: plan.Group.State, Members: plan.Group.Members}
	fill := func() {
		res.Steps = res.Steps[:0]
		for _, s := range plan.Steps {
			st := ResetStep{Topic: s.Topic, Partition: s.Partition, Watermark: s.Watermark, Committed: -1, Target: s.Target,
				Action: s.Action, Messages: s.Messages(), Note: s.Note, AuditID: s.AuditID, Done: s.Done}
			if s.Action == offsets.ActionNone {
				st.Messages = 0
			}
			if s.Committed != nil {
				st.Committed = *s.Committed
			}
			res.Steps = append(res.Steps, st)
		}
	}
	fill()
	if len(plan.Group.Members) > 0 {
		res.Refused = (&offsets.ActiveGroupError{Group: req.Group, State: plan.Group.State, Members: plan.Group.Members}).Error()
		return res, http.StatusConflict, nil
	}
	if p.DryRun || !plan.Changes() {
		return res, http.StatusOK, nil
	}
	err = h.op.ExecuteReset(ctx, plan)
	fill()
	var active *offsets.ActiveGroupError
	switch {
	case errors.As(err, &active):
		res.Refused = err.Error()
		return res, http.StatusConflict, nil
	case err != nil:
		res.Error = h.redact(err.Error())
		h.log.Error("console: offsets reset stopped", zap.String("group", req.Group), zap.String("topic", req.Topic), zap.String("error", res.Error))
		return res, http.StatusInternalServerError, nil
	}
	res.Executed = true
	h.log.Info("console: offsets reset", zap.String("group", req.Group), zap.String("topic", req.Topic), zap.String("target", res.Target),
		zap.String("mode", res.Mode), zap.String("actor", actor), zap.String("reason", req.Reason))
	return res, http.StatusOK, nil
}

// apiOffsetsReset answers POST /api/offsets/reset with a ResetParams body: 200 and the
// ResetResult (a dry run's plan, or what was applied), 409 while the group has active
// members (nothing changed), 400 a request that cannot be planned.
func (h *Handler) apiOffsetsReset(w http.ResponseWriter, r *http.Request) {
	var p ResetParams
	if err := decodeJSON(r, &p); err != nil {
		h.fail(w, r, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	res, status, err := h.reset(r.Context(), p, h.actor(r))
	if err != nil {
		h.fail(w, r, status, err.Error())
		return
	}
	h.writeJSON(w, status, res)
}

// offsetsView is the data of the offsets page of one group.
type offsetsView struct {
	// Sharded shows the shard column (Config.Shards).
	Sharded bool
	Group   string
	Topic   string
	State   string
	Member  []string
	Rows    []PartitionRow
	Events  []offsetstore.Event
	Topics  []string
	Reset   *ResetResult
	Form    ResetForm
	// Airflow is the group's Airflow drift (nil: the console has no Airflow access).
	Airflow *AirflowDrift
}

// ResetForm is what the reset form held, to show it again with the plan.
type ResetForm struct {
	Topic, Partition, Target, Value, Mode, Reason string
}

// offsetsPage renders GET /offsets?group=G[&topic=T]: the group's partitions, its offset audit
// trail (every watermark move) and the reset form.
func (h *Handler) offsetsPage(w http.ResponseWriter, r *http.Request) {
	g, topic := r.URL.Query().Get("group"), r.URL.Query().Get("topic")
	h.renderOffsets(w, r, g, topic, nil, ResetForm{Topic: topic, Target: "to_database"}, "")
}

func (h *Handler) renderOffsets(w http.ResponseWriter, r *http.Request, g, topic string, res *ResetResult, form ResetForm, errMsg string) {
	p := h.page(r, "partitions", "Offsets of "+g, nil)
	if g == "" {
		h.fail(w, r, http.StatusBadRequest, "group is required: /offsets?group=G")
		return
	}
	v := offsetsView{Sharded: h.cfg.Shards != nil, Group: g, Topic: topic, Reset: res, Form: form}
	rows, err := h.partitions(r.Context(), g)
	if err == nil {
		seen := map[string]bool{}
		for _, row := range rows {
			if topic == "" || row.Topic == topic {
				v.Rows = append(v.Rows, row)
			}
			if row.Topic != "" && !seen[row.Topic] {
				seen[row.Topic] = true
				v.Topics = append(v.Topics, row.Topic)
			}
		}
		var grp offsets.Group
		if grp, err = h.op.Group(r.Context(), g); err == nil {
			v.State, v.Member = grp.State, grp.Members
			v.Events, err = h.op.Events(r.Context(), g, topic)
		}
	}
	if err != nil {
		p.Error = err.Error()
	}
	if errMsg != "" {
		p.Error = errMsg
	}
	// newest first on the page
	for i, j := 0, len(v.Events)-1; i < j; i, j = i+1, j-1 {
		v.Events[i], v.Events[j] = v.Events[j], v.Events[i]
	}
	h.addCharts(r.Context(), g, v.Rows, 420, 110, true)
	v.Airflow = h.airflowDrift(r.Context(), g)
	p.Data = v
	h.render(w, r, http.StatusOK, "offsets", p)
}

// offsetsResetForm handles POST /offsets/reset from the offsets page: group, topic,
// partition, target (to_offset, to_time, to_earliest, to_latest, to_database), value (the
// offset or time), mode, reason and dry_run.
func (h *Handler) offsetsResetForm(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "bad form: "+err.Error())
		return
	}
	f := ResetForm{Topic: r.PostFormValue("topic"), Partition: strings.TrimSpace(r.PostFormValue("partition")), Target: r.PostFormValue("target"),
		Value: strings.TrimSpace(r.PostFormValue("value")), Mode: r.PostFormValue("mode"), Reason: r.PostFormValue("reason")}
	p := ResetParams{Group: r.PostFormValue("group"), Topic: f.Topic, Reason: f.Reason, DryRun: r.PostFormValue("dry_run") != ""}
	if f.Target != "to_database" {
		p.Mode = f.Mode
	}
	var perr error
	if f.Partition != "" {
		n, err := strconv.ParseInt(f.Partition, 10, 32)
		if err != nil {
			perr = fmt.Errorf("partition %q: want a number", f.Partition)
		}
		n32 := int32(n)
		p.Partition = &n32
	}
	switch f.Target {
	case "to_offset":
		n, err := strconv.ParseInt(f.Value, 10, 64)
		if err != nil {
			perr = fmt.Errorf("offset %q: want a number", f.Value)
		}
		p.ToOffset = &n
	case "to_time":
		p.ToTime = f.Value
	case "to_earliest":
		p.ToEarliest = true
	case "to_latest":
		p.ToLatest = true
	case "to_database":
		p.ToDatabase = true
	default:
		perr = fmt.Errorf("target %q: want to_offset, to_time, to_earliest, to_latest or to_database", f.Target)
	}
	if perr != nil {
		h.renderOffsets(w, r, p.Group, "", nil, f, perr.Error())
		return
	}
	res, _, err := h.reset(r.Context(), p, h.actor(r))
	if err != nil {
		h.renderOffsets(w, r, p.Group, "", nil, f, err.Error())
		return
	}
	h.renderOffsets(w, r, p.Group, "", res, f, "")
}
