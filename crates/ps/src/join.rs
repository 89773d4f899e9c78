//! Futures run together on the calling task: for fan-outs (one request per server) where a
//! spawned task per request would only add a hand-off to another thread and back.

use std::future::Future;
use std::task::Poll;

/// Run `futs` concurrently on the current task; their outputs in the order given.
pub(crate) async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if let Some(fut) = f {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *out = Some(v);
                        *f = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outs.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_come_in_the_order_given_whatever_order_they_finish_in() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let outs = rt.block_on(join_all(vec![
            Box::pin(async move { rx.await.unwrap() })
                as std::pin::Pin<Box<dyn Future<Output = u32>>>,
            Box::pin(async move {
                // Finishes first, and lets the first one finish.
                tx.send(1).unwrap();
                2
            }),
            Box::pin(async { 3 }),
        ]));
        assert_eq!(outs, vec![1, 2, 3]);
        assert!(rt
            .block_on(join_all(Vec::<std::future::Ready<u8>>::new()))
            .is_empty());
    }
}
