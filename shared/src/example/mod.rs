pub mod expense;
