package redisstore

// Group slots: CreateGroup, Group and FormGroup (group_create.lua,
// group_form.lua), GroupHoldersAccepted, and CloseGroup and CloseGroups
// (group_close.lua) with closing, which reads that script's reply.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/shared/reservation"
	"github.com/redis/go-redis/v9"
)

// CreateGroup implements reservation.GroupSlots.
func (s *Store) CreateGroup(ctx context.Context, g reservation.Group) error {
	k := keysOf(g.SKU)
	err := groupCreateScript.Run(ctx, s.rdb, []string{k.group(g.ID), k.meta()},
		g.Capacity, ms(g.Deadline), ms(g.Deadline.Add(s.retention))).Err()
	if err != nil {
		return reservation.Unavailable("redis create group", err)
	}
	return nil
}

// Group implements reservation.GroupSlots.
func (s *Store) Group(ctx context.Context, sku, id string) (reservation.Group, error) {
	m, err := s.rdb.HGetAll(ctx, keysOf(sku).group(id)).Result()
	if err != nil {
		return reservation.Group{}, reservation.Unavailable("redis group", err)
	}
	if len(m) == 0 {
		return reservation.Group{}, reservation.ErrUnknownGroup
	}
	g := reservation.Group{ID: id, SKU: sku, Status: reservation.GroupStatus(m["status"])}
	g.Capacity, _ = strconv.Atoi(m["capacity"])
	g.Remaining, _ = strconv.Atoi(m["remaining"])
	d, _ := strconv.ParseInt(m["deadline"], 10, 64)
	g.Deadline = time.UnixMilli(d).UTC()
	if f, _ := strconv.ParseInt(m["formed_at"], 10, 64); f > 0 {
		g.FormedAt = time.UnixMilli(f).UTC()
	}
	if f, _ := strconv.ParseInt(m["full_at"], 10, 64); f > 0 && g.Remaining <= 0 {
		g.FullAt = time.UnixMilli(f).UTC()
	}
	return g, nil
}

// FormGroup implements reservation.GroupSlots.
func (s *Store) FormGroup(ctx context.Context, g reservation.Group, formedAt time.Time) (bool, error) {
	n, err := groupFormScript.Run(ctx, s.rdb, []string{keysOf(g.SKU).group(g.ID)}, ms(formedAt)).Int()
	if err != nil {
		return false, reservation.Unavailable("redis form group", err)
	}
	return n == 1, nil
}

// GroupHoldersAccepted implements reservation.GroupSlots: the group's members
// hash, then each member's hold, in one pipeline.
func (s *Store) GroupHoldersAccepted(ctx context.Context, g reservation.Group) (bool, error) {
	k := keysOf(g.SKU)
	members, err := s.rdb.HGetAll(ctx, k.members(g.ID)).Result()
	if err != nil {
		return false, reservation.Unavailable("redis group members", err)
	}
	if len(members) == 0 {
		return true, nil
	}
	cmds := make([]*redis.SliceCmd, 0, len(members))
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range members {
			cmds = append(cmds, p.HMGet(ctx, k.hold(id), "state", "sent"))
		}
		return nil
	})
	if err != nil {
		return false, reservation.Unavailable("redis group holds", err)
	}
	for _, c := range cmds {
		v := c.Val()
		if len(v) == 2 && v[0] == "HELD" && v[1] == nil {
			return false, nil // sent not yet: its send may still fail
		}
	}
	return true, nil
}

// CloseGroup implements reservation.GroupSlots.
func (s *Store) CloseGroup(ctx context.Context, g reservation.Group) (reservation.GroupClosing, error) {
	k := keysOf(g.SKU)
	out, err := groupCloseScript.Run(ctx, s.rdb, []string{k.group(g.ID), k.members(g.ID)}, s.now()).StringSlice()
	if err != nil {
		return reservation.GroupClosing{}, reservation.Unavailable("redis close group", err)
	}
	return closing(g.ID, out)
}

// CloseGroups implements reservation.GroupSlots: group_close.lua for each group,
// all in one pipeline (per shard).
func (s *Store) CloseGroups(ctx context.Context, gs []reservation.Group) ([]reservation.GroupClosing, []error) {
	out, errs := make([]reservation.GroupClosing, len(gs)), make([]error, len(gs))
	if len(gs) == 0 {
		return out, errs
	}
	now := s.now()
	cmds, err := s.pipeline(ctx, func(p redis.Pipeliner) []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(gs))
		for i, g := range gs {
			k := keysOf(g.SKU)
			cmds[i] = groupCloseScript.EvalSha(ctx, p, []string{k.group(g.ID), k.members(g.ID)}, now)
		}
		return cmds
	}, groupCloseScript)
	for i, g := range gs {
		if err != nil {
			errs[i] = err
			continue
		}
		reply, cerr := cmds[i].StringSlice()
		if cerr != nil {
			errs[i] = reservation.Unavailable("redis close group", cerr)
			continue
		}
		out[i], errs[i] = closing(g.ID, reply)
	}
	return out, errs
}

// closing reads group_close.lua's reply.
func closing(id string, out []string) (reservation.GroupClosing, error) {
	if len(out) == 0 {
		return reservation.GroupClosing{}, fmt.Errorf("redis close group %s: empty reply", id)
	}
	switch out[0] {
	case "UNKNOWN":
		return reservation.GroupClosing{Unknown: true}, nil
	case "NOT_DUE":
		return reservation.GroupClosing{NotDue: true}, nil
	case "FORMED":
		c := reservation.GroupClosing{Status: reservation.GroupFormed}
		if len(out) > 1 {
			if f, _ := strconv.ParseInt(out[1], 10, 64); f > 0 {
				c.FormedAt = time.UnixMilli(f).UTC()
			}
		}
		return c, nil
	case "FULL":
		c := reservation.GroupClosing{Full: true}
		if len(out) > 1 {
			if f, _ := strconv.ParseInt(out[1], 10, 64); f > 0 {
				c.FullAt = time.UnixMilli(f).UTC()
			}
		}
		return c, nil
	case "FAILED":
		return reservation.GroupClosing{Status: reservation.GroupFailed, Holders: out[1:]}, nil
	}
	return reservation.GroupClosing{}, fmt.Errorf("redis close group %s: unknown code %q", id, out[0])
}
