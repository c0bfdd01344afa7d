"""The referee of trainers' rows: `callgrove audit CAPTURE BATCH` says, for every token a policy
sampled in the capture, how many times the batch trains it and whether in the context it was
sampled in (`referee`), reading the batch forms trainers are fed (`batches`)."""

from callgrove.audit.referee import AuditReport, CallAudit, Referee, TrainedRow, audit

__all__ = ["AuditReport", "CallAudit", "Referee", "TrainedRow", "audit"]
