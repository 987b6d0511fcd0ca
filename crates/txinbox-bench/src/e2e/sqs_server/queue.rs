//! The queue model: messages, groups, visibility, deduplication and the FIFO selection of a receive.

use super::*;

impl Queue {
    pub(super) fn state(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn get_attributes(&self, input: &Value) -> Answer {
        let mut asked: Vec<&str> = names_of(input, "AttributeNames").collect();
        if asked.is_empty() {
            // Without names SQS answers no attributes.
            return Ok(json!({}));
        }
        let all = asked.contains(&"All");
        let now = Instant::now();
        let mut state = self.state();
        let (visible, not_visible) = state.counts(now);
        let mut have: BTreeMap<String, String> = BTreeMap::new();
        have.insert(
            "QueueArn".into(),
            format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{}", self.name),
        );
        have.insert(
            "VisibilityTimeout".into(),
            state.attribute_secs("VisibilityTimeout", 30).to_string(),
        );
        have.insert("ApproximateNumberOfMessages".into(), visible.to_string());
        have.insert(
            "ApproximateNumberOfMessagesNotVisible".into(),
            not_visible.to_string(),
        );
        have.insert("ApproximateNumberOfMessagesDelayed".into(), "0".into());
        have.insert("CreatedTimestamp".into(), self.created.to_string());
        have.insert("LastModifiedTimestamp".into(), self.created.to_string());
        for (k, default) in [
            ("DelaySeconds", "0"),
            ("MaximumMessageSize", "262144"),
            ("MessageRetentionPeriod", "345600"),
            ("ReceiveMessageWaitTimeSeconds", "0"),
            ("SqsManagedSseEnabled", "false"),
        ] {
            have.insert(k.into(), default.into());
        }
        if self.fifo {
            have.insert("FifoQueue".into(), "true".into());
            have.insert("ContentBasedDeduplication".into(), "false".into());
            have.insert("DeduplicationScope".into(), "queue".into());
            have.insert("FifoThroughputLimit".into(), "perQueue".into());
        }
        // What the queue was created with (RedrivePolicy, ...), over the defaults.
        for (k, v) in &state.attributes {
            if k != "FifoQueue" || self.fifo {
                have.insert(k.clone(), v.clone());
            }
        }
        if !all {
            asked.sort_unstable();
            have.retain(|k, _| asked.binary_search(&k.as_str()).is_ok());
        }
        Ok(json!({ "Attributes": have }))
    }

    pub(super) fn purge(&self) -> Value {
        let mut state = self.state();
        let attributes = std::mem::take(&mut state.attributes);
        let dedup = std::mem::take(&mut state.dedup);
        let dedup_order = std::mem::take(&mut state.dedup_order);
        let next_seq = state.next_seq;
        let dedup_window = state.dedup_window;
        *state = QueueState {
            attributes,
            dedup,
            dedup_order,
            dedup_window,
            next_seq,
            ..QueueState::default()
        };
        drop(state);
        self.changed.notify_waiters();
        json!({})
    }

    pub(super) fn send_one(&self, input: &Value) -> Answer {
        let sent = self.state().send(input, self.fifo, Instant::now())?;
        self.changed.notify_waiters();
        Ok(json!({
            "MessageId": sent.message_id,
            "MD5OfMessageBody": sent.md5,
            "SequenceNumber": sent.sequence_number,
        }))
    }

    pub(super) fn send_batch(&self, input: &Value) -> Answer {
        let fifo = self.fifo;
        self.each_entry(input, |state, e, now| {
            let sent = state.send(e, fifo, now)?;
            let mut entry = json!({
                "MessageId": sent.message_id,
                "MD5OfMessageBody": sent.md5,
            });
            if let Some(s) = sent.sequence_number {
                entry["SequenceNumber"] = Value::String(s);
            }
            Ok(entry)
        })
    }

    /// A batch action: `apply` on each entry under one lock, its answer (a JSON object) with the entry's `Id`
    /// in `Successful`, its fault in `Failed`; waiting receives are woken once.
    fn each_entry(
        &self,
        input: &Value,
        mut apply: impl FnMut(&mut QueueState, &Value, Instant) -> Result<Value, Fault>,
    ) -> Answer {
        let entries = entries_of(input)?;
        let (mut ok, mut failed) = (Vec::new(), Vec::new());
        {
            let now = Instant::now();
            let mut state = self.state();
            for e in entries {
                let id = str_of(e, "Id").unwrap_or_default();
                match apply(&mut state, e, now) {
                    Ok(mut entry) => {
                        entry["Id"] = Value::String(id.to_owned());
                        ok.push(entry);
                    }
                    Err(f) => failed.push(failed_entry(id, f)),
                }
            }
        }
        self.changed.notify_waiters();
        Ok(json!({"Successful": ok, "Failed": failed}))
    }

    pub(super) fn delete_one(&self, input: &Value) -> Answer {
        let handle = required(input, "ReceiptHandle")?;
        self.state().delete(handle)?;
        self.changed.notify_waiters();
        Ok(json!({}))
    }

    pub(super) fn delete_batch(&self, input: &Value) -> Answer {
        self.each_entry(input, |state, e, _| {
            let handle =
                str_of(e, "ReceiptHandle").ok_or_else(|| Fault::missing("ReceiptHandle"))?;
            state.delete(handle)?;
            Ok(json!({}))
        })
    }

    pub(super) fn change_visibility_one(&self, input: &Value) -> Answer {
        let handle = required(input, "ReceiptHandle")?;
        let secs = int_of(input, "VisibilityTimeout")?
            .ok_or_else(|| Fault::missing("VisibilityTimeout"))?;
        self.state()
            .change_visibility(handle, secs, Instant::now())?;
        self.changed.notify_waiters();
        Ok(json!({}))
    }

    pub(super) fn change_visibility_batch(&self, input: &Value) -> Answer {
        self.each_entry(input, |state, e, now| {
            let handle = required(e, "ReceiptHandle")?;
            let secs = int_of(e, "VisibilityTimeout")?
                .ok_or_else(|| Fault::missing("VisibilityTimeout"))?;
            state.change_visibility(handle, secs, now)?;
            Ok(json!({}))
        })
    }
}

// ---------------------------------------------------------------------------------------------------------
// One queue's messages.

pub(super) struct Msg {
    seq: u64,
    message_id: String,
    body: String,
    md5: String,
    /// The `MessageAttributes` as sent (name → `{"DataType", "StringValue" | "BinaryValue"}`).
    attributes: Map<String, Value>,
    group: Option<String>,
    dedup: Option<String>,
    sent_ms: u64,
    receive_count: u64,
    first_receive_ms: Option<u64>,
    /// In flight until this instant (`None`: not in flight).
    deadline: Option<Instant>,
    /// The handle of the latest receive: the only one a delete or a visibility change accepts.
    handle: Option<String>,
}

#[derive(Default)]
pub(super) struct Group {
    /// The group's messages in send order.
    msgs: VecDeque<Msg>,
    /// Messages of `msgs` with a deadline (some may have passed it, noticed lazily).
    in_flight: usize,
}

impl Group {
    /// Whether a message of the group is in flight at `now`; forgets the deadlines that passed.
    pub(super) fn busy(&mut self, now: Instant) -> bool {
        if self.in_flight == 0 {
            return false;
        }
        let mut seen = 0;
        let mut busy = false;
        let total = self.in_flight;
        for m in self.msgs.iter_mut() {
            if seen == total {
                break;
            }
            if let Some(d) = m.deadline {
                seen += 1;
                if d > now {
                    busy = true;
                } else {
                    m.deadline = None;
                    self.in_flight -= 1;
                }
            }
        }
        busy
    }

    pub(super) fn position(&self, seq: u64) -> Option<usize> {
        self.msgs.binary_search_by_key(&seq, |m| m.seq).ok()
    }
}

#[derive(Default)]
pub(super) struct QueueState {
    /// The attributes the queue was created with.
    attributes: BTreeMap<String, String>,
    groups: HashMap<String, Group>,
    /// The groups in the order of their oldest message: that message's sequence number → group.
    order: BTreeMap<u64, String>,
    /// Current receipt handle → (group, sequence number).
    handles: HashMap<String, (String, u64)>,
    /// Deduplication id → (when first seen, its message id).
    dedup: HashMap<String, (Instant, String)>,
    dedup_order: VecDeque<(Instant, String)>,
    /// How long a deduplication id is remembered.
    dedup_window: Duration,
    next_seq: u64,
}

pub(super) struct Sent {
    message_id: String,
    md5: String,
    sequence_number: Option<String>,
}

impl QueueState {
    /// An empty queue with the attributes it was created with, remembering deduplication ids for
    /// `dedup_window`.
    pub(super) fn with_attributes(
        attributes: BTreeMap<String, String>,
        dedup_window: Duration,
    ) -> Self {
        Self {
            attributes,
            dedup_window,
            ..Self::default()
        }
    }

    pub(super) fn attribute_secs(&self, name: &str, default: u64) -> u64 {
        self.attributes
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    pub(super) fn counts(&mut self, now: Instant) -> (usize, usize) {
        let (mut visible, mut not_visible) = (0, 0);
        for g in self.groups.values_mut() {
            g.busy(now);
            not_visible += g.in_flight;
            visible += g.msgs.len() - g.in_flight;
        }
        (visible, not_visible)
    }

    pub(super) fn send(&mut self, input: &Value, fifo: bool, now: Instant) -> Result<Sent, Fault> {
        let body = required(input, "MessageBody")?;
        if body.is_empty() {
            return Err(Fault::invalid("The message body must not be empty."));
        }
        if body.len() > 262_144 {
            return Err(Fault::invalid("The message body is longer than 256 KiB."));
        }
        let attributes = match input.get("MessageAttributes") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => {
                if a.len() > 10 {
                    return Err(Fault::invalid("more than 10 message attributes"));
                }
                a.clone()
            }
            Some(_) => return Err(Fault::invalid("MessageAttributes is not a map")),
        };
        let md5 = md5_hex(body);
        let (group, dedup) = if fifo {
            let group = required(input, "MessageGroupId")?.to_owned();
            let dedup = match str_of(input, "MessageDeduplicationId") {
                Some(d) => d.to_owned(),
                None if self
                    .attributes
                    .get("ContentBasedDeduplication")
                    .is_some_and(|v| v == "true") =>
                {
                    md5.clone()
                }
                None => return Err(Fault::invalid(
                    "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly",
                )),
            };
            (Some(group), Some(dedup))
        } else {
            (None, None)
        };
        if let Some(d) = &dedup {
            while self
                .dedup_order
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) >= self.dedup_window)
            {
                if let Some((at, id)) = self.dedup_order.pop_front() {
                    if self.dedup.get(&id).is_some_and(|(first, _)| *first == at) {
                        self.dedup.remove(&id);
                    }
                }
            }
            if let Some((_, message_id)) = self.dedup.get(d) {
                // Accepted and dropped: the first one's id.
                return Ok(Sent {
                    message_id: message_id.clone(),
                    md5,
                    sequence_number: None,
                });
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let message_id = uuid::Uuid::new_v4().to_string();
        if let Some(d) = &dedup {
            self.dedup.insert(d.clone(), (now, message_id.clone()));
            self.dedup_order.push_back((now, d.clone()));
        }
        // A standard queue's message is a group of its own: never blocked by another.
        let key = group.clone().unwrap_or_else(|| format!("\0{seq}"));
        let g = self.groups.entry(key.clone()).or_default();
        if g.msgs.is_empty() {
            self.order.insert(seq, key);
        }
        g.msgs.push_back(Msg {
            seq,
            message_id: message_id.clone(),
            body: body.to_owned(),
            md5: md5.clone(),
            attributes,
            group,
            dedup,
            sent_ms: epoch_ms(),
            receive_count: 0,
            first_receive_ms: None,
            deadline: None,
            handle: None,
        });
        Ok(Sent {
            message_id,
            md5,
            sequence_number: fifo.then(|| format!("{:020}", seq + 1)),
        })
    }

    pub(super) fn receive(
        &mut self,
        max: usize,
        visibility: Option<Duration>,
        now: Instant,
        counter: &AtomicU64,
        select: &Selection,
        fifo: bool,
    ) -> Vec<Value> {
        let visibility = visibility
            .unwrap_or_else(|| Duration::from_secs(self.attribute_secs("VisibilityTimeout", 30)));
        let now_ms = epoch_ms();
        let mut out = Vec::new();
        let Self {
            groups,
            order,
            handles,
            ..
        } = self;
        for key in order.values() {
            if out.len() >= max {
                break;
            }
            let Some(g) = groups.get_mut(key) else {
                continue;
            };
            if g.busy(now) {
                continue;
            }
            // Free: nothing of it is in flight; take from its oldest on.
            for m in g.msgs.iter_mut() {
                if out.len() >= max {
                    break;
                }
                let handle = format!(
                    "rh-{}-{}-{}",
                    m.seq,
                    counter.fetch_add(1, Ordering::Relaxed),
                    &m.message_id[..8]
                );
                if let Some(old) = m.handle.replace(handle.clone()) {
                    handles.remove(&old);
                }
                handles.insert(handle.clone(), (key.clone(), m.seq));
                m.deadline = Some(now + visibility);
                g.in_flight += 1;
                m.receive_count += 1;
                let first = *m.first_receive_ms.get_or_insert(now_ms);
                out.push(select.message(m, &handle, first, fifo));
            }
        }
        out
    }

    /// Finds the message of a current receipt handle.
    pub(super) fn find(&mut self, handle: &str) -> Result<(&mut Group, usize), Fault> {
        let (key, seq) = self
            .handles
            .get(handle)
            .ok_or_else(|| Fault::bad_handle(handle))?;
        let g = self
            .groups
            .get_mut(key)
            .ok_or_else(|| Fault::bad_handle(handle))?;
        let i = g.position(*seq).ok_or_else(|| Fault::bad_handle(handle))?;
        Ok((g, i))
    }

    pub(super) fn delete(&mut self, handle: &str) -> Result<(), Fault> {
        let (g, i) = self.find(handle)?;
        let Some(m) = g.msgs.remove(i) else {
            return Err(Fault::bad_handle(handle));
        };
        if m.deadline.is_some() {
            g.in_flight -= 1;
        }
        let empty = g.msgs.is_empty();
        let new_head = if i == 0 {
            g.msgs.front().map(|h| h.seq)
        } else {
            None
        };
        let (key, _) = self
            .handles
            .remove(handle)
            .ok_or_else(|| Fault::bad_handle(handle))?;
        if i == 0 {
            self.order.remove(&m.seq);
            if let Some(h) = new_head {
                self.order.insert(h, key.clone());
            }
        }
        if empty {
            self.groups.remove(&key);
        }
        Ok(())
    }

    pub(super) fn change_visibility(
        &mut self,
        handle: &str,
        secs: i64,
        now: Instant,
    ) -> Result<(), Fault> {
        if !(0..=43_200).contains(&secs) {
            return Err(Fault::invalid(format!(
                "VisibilityTimeout {secs} is outside 0 to 43200"
            )));
        }
        let (g, i) = self.find(handle)?;
        let m = &mut g.msgs[i];
        match m.deadline {
            Some(d) if d > now => {}
            Some(_) => {
                // Its deadline passed: no longer in flight.
                m.deadline = None;
                g.in_flight -= 1;
                return Err(Fault::not_in_flight());
            }
            None => return Err(Fault::not_in_flight()),
        }
        if secs == 0 {
            m.deadline = None;
            g.in_flight -= 1;
        } else {
            m.deadline = Some(now + Duration::from_secs(secs as u64));
        }
        Ok(())
    }
}

/// The attributes a receive asked for.
pub(super) struct Selection {
    all_system: bool,
    system: Vec<String>,
    all_attributes: bool,
    attributes: Vec<String>,
}

impl Selection {
    pub(super) fn of(input: &Value) -> Self {
        let system: Vec<String> = names_of(input, "AttributeNames")
            .chain(names_of(input, "MessageSystemAttributeNames"))
            .map(str::to_owned)
            .collect();
        let attributes: Vec<String> = names_of(input, "MessageAttributeNames")
            .map(str::to_owned)
            .collect();
        Self {
            all_system: system.iter().any(|n| n == "All"),
            system,
            all_attributes: attributes.iter().any(|n| n == "All" || n == ".*"),
            attributes,
        }
    }

    pub(super) fn wants_system(&self, name: &str) -> bool {
        self.all_system || self.system.iter().any(|n| n == name)
    }

    pub(super) fn wants_attribute(&self, name: &str) -> bool {
        self.all_attributes
            || self.attributes.iter().any(|n| match n.strip_suffix(".*") {
                Some(prefix) => name.starts_with(prefix) && name[prefix.len()..].starts_with('.'),
                None => n == name,
            })
    }

    pub(super) fn message(
        &self,
        m: &Msg,
        handle: &str,
        first_receive_ms: u64,
        fifo: bool,
    ) -> Value {
        let mut system = Map::new();
        let mut put = |name: &str, value: String| {
            if self.wants_system(name) {
                system.insert(name.to_owned(), Value::String(value));
            }
        };
        put("SenderId", "AIDAIBENCHTXINBOX00000".into());
        put("SentTimestamp", m.sent_ms.to_string());
        put("ApproximateReceiveCount", m.receive_count.to_string());
        put(
            "ApproximateFirstReceiveTimestamp",
            first_receive_ms.to_string(),
        );
        if fifo {
            if let Some(g) = &m.group {
                put("MessageGroupId", g.clone());
            }
            if let Some(d) = &m.dedup {
                put("MessageDeduplicationId", d.clone());
            }
            put("SequenceNumber", format!("{:020}", m.seq + 1));
        }
        let mut message = json!({
            "MessageId": m.message_id,
            "ReceiptHandle": handle,
            "MD5OfBody": m.md5,
            "Body": m.body,
        });
        if !system.is_empty() {
            message["Attributes"] = Value::Object(system);
        }
        let attributes: Map<String, Value> = m
            .attributes
            .iter()
            .filter(|(k, _)| self.wants_attribute(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !attributes.is_empty() {
            message["MessageAttributes"] = Value::Object(attributes);
        }
        message
    }
}
